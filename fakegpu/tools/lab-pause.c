/*
 * lab-pause - what a tessera-lab container runs when it names only an
 * image (no command, no arguments): it waits, as a pause container does,
 * reaping the children it inherits as PID 1, and exits 0 at SIGTERM or
 * SIGINT so that deleting the pod ends it at once.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_stop(int sig)
{
    (void)sig;
    stop = 1;
}

static void on_child(int sig)
{
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv)
{
    (void)argv;
    if (argc > 1) {
        fprintf(stderr, "lab-pause takes no arguments\n");
        return 2;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_child;
    sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &sa, NULL);
    while (!stop)
        pause();
    return 0;
}
