// Command tessera is the binary Tessera's image ships: the scheduler, the
// admission webhook, the node agent and the kubelet shim; the first
// argument picks the component. The research simulator is tessera-sim,
// the emulated cluster tessera-lab, the kubectl plugin kubectl-tessera
// (deps_test.go checks what each links).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/tessera-gpu/tessera/internal/cli"
	"github.com/tessera-gpu/tessera/internal/version"
)

// command is one subcommand: run gets the arguments after its name.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{
	"version":         {"print the version and exit", runVersion},
	"scheduler":       {"run kube-scheduler with the Tessera GPU-sharing plugin (kube-scheduler flags)", runScheduler},
	"webhook":         {"serve the admission webhook for GPU pods", runWebhook},
	"node-agent":      {"discover GPUs, publish the node inventory, serve the GPU device plugin", runNodeAgent},
	"kubelet-shim":    {"hold the kubelet's device-plugin connection and forward it to the node agent", runKubeletShim},
	"install-limiter": {"copy the limiter library onto the host (the node agent's init container)", runInstallLimiter},
	"wait-ready":      {"wait until the release's DaemonSets are ready on every node (the chart's post-install hook)", runWaitReady},
}

// errUsage marks errors whose message is a usage text (exit code 2).
var errUsage = cli.ErrUsage

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok && args[0] == "simulate" {
		fmt.Fprintln(stderr, "tessera: the simulator is a binary of its own: tessera-sim (make build; or go run ./cmd/tessera-sim), with the flags tessera simulate had")
		return 2
	}
	if !ok {
		fmt.Fprintf(stderr, "tessera: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	return cli.ExitCode(stderr, "tessera", args[0], cmd.run(ctx, args[1:], stdout, stderr))
}

// parseFlags parses a subcommand's flags (cli.ParseFlags).
func parseFlags(fs *flag.FlagSet, args []string) error { return cli.ParseFlags(fs, args) }

func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage: tessera <command> [flags]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-15s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'tessera <command> -h' for a command's flags.")
}

func runVersion(_ context.Context, args []string, stdout, _ io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("%w: version takes no arguments, got %q", errUsage, args)
	}
	fmt.Fprintln(stdout, version.String())
	return nil
}
