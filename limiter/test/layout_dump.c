/* layout_dump.c - prints the shared-state layout (name offset size) for the
 * Go layout test, and with "write PATH" creates a state file with known
 * contents for the Go reader test ("write3 PATH": the same as a version-3
 * file: version 3, cut before the counters). */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../src/tl_state.h"

#define F(field) printf("state.%s %zu %zu\n", #field, offsetof(tl_state, field), sizeof(((tl_state *)0)->field))
#define C(field) printf("counters.%s %zu %zu\n", #field, offsetof(tl_counters, field), sizeof(((tl_counters *)0)->field))
#define S(field) printf("slot.%s %zu %zu\n", #field, offsetof(tl_proc_slot, field), sizeof(((tl_proc_slot *)0)->field))

int main(int argc, char **argv)
{
    if (argc == 3 && (!strcmp(argv[1], "write") || !strcmp(argv[1], "write3"))) {
        tl_shared sh;
        if (tl_shared_open(&sh, argv[2]) != 0 || tl_shared_register(&sh) != 0)
            return 1;
        uint64_t lim[TL_MAX_DEVICES] = {1000, 2000};
        uint32_t sm[TL_MAX_DEVICES] = {30, 0};
        tl_shared_publish_limits(&sh, lim, sm, TL_MAX_DEVICES);
        if (tl_shared_reserve(&sh, 0, 600, 1000) || tl_shared_reserve(&sh, 1, 1500, 2000) ||
            tl_shared_reserve(&sh, 0, 500, 1000) == 0)
            return 1;
        tl_shared_count_refused(&sh, 0);
        tl_shared_count_refused(&sh, 0);
        tl_shared_count_refused(&sh, 1);
        tl_shared_add_throttled(&sh, 1, 2500000000ull);
        if (!strcmp(argv[1], "write3")) {
            sh.st->version = TL_STATE_VERSION_V3;
            if (ftruncate(sh.fd, (off_t)TL_STATE_V3_SIZE) != 0)
                return 1;
        }
        printf("pid %d slot %d\n", (int)getpid(), sh.slot);
        return 0; /* the slot stays: this process is gone afterwards */
    }
    printf("magic %llu 0\n", (unsigned long long)TL_STATE_MAGIC);
    printf("version %u 0\n", TL_STATE_VERSION);
    printf("max_devices %d 0\n", TL_MAX_DEVICES);
    printf("max_procs %d 0\n", TL_MAX_PROCS);
    printf("sizeof.state %zu 0\n", sizeof(tl_state));
    printf("sizeof.slot %zu 0\n", sizeof(tl_proc_slot));
    printf("sizeof.state_v3 %zu 0\n", (size_t)TL_STATE_V3_SIZE);
    printf("version_v3 %u 0\n", TL_STATE_VERSION_V3);
    printf("slot_lock_base %lld 0\n", TL_SLOT_LOCK_BASE);
    F(magic);
    F(version);
    F(header_size);
    F(slot_size);
    F(max_devices);
    F(max_procs);
    F(init_state);
    F(seq);
    F(limit);
    F(total_used);
    F(sm_limit);
    F(reclaimed_procs);
    F(last_reclaim_ns);
    F(lock);
    F(slots);
    F(counters);
    C(throttled_ns);
    C(refused_allocs);
    S(pid);
    S(host_pid);
    S(pidns);
    S(used);
    return 0;
}
