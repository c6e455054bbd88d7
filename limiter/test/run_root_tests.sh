# run_root_tests.sh - sourced by run_tests.sh (uses its run/check/lim, $B,
# $T, $PRE, $L). As root: the read-only limits file, processes started
# without the environment, a restarted container.

if [ "$(id -u)" != 0 ]; then
    need root-tests "root (a limits file at /etc/tessera in a private mount namespace, pid namespaces)" "run the tests as root"
elif ! command -v unshare >/dev/null; then
    need root-tests "unshare (private mount and pid namespaces)" "apt-get install util-linux"
else
    # An /etc for a container: ld.so.preload naming the library (it reaches
    # processes that drop the environment) and tessera/limiter.conf.
    # with_etc UPPER CMD...: CMD in a private mount namespace with UPPER
    # laid over /etc.
    with_etc() {
        up=$1; shift
        timeout 120 unshare -m sh -c 'mount --make-rprivate / && mount -t overlay overlay -o "lowerdir=$0:/etc" /etc && exec "$@"' \
            "$up" "$@"
    }
    mketc() { # mketc DIR CONF_TEXT: an /etc overlay with the preload and this limits file
        mkdir -p "$1/tessera"
        echo "$PRE" | tr ' ' '\n' >"$1/ld.so.preload"
        printf '%s' "$2" >"$1/tessera/limiter.conf"
        chmod 644 "$1/tessera/limiter.conf"
    }
    # su - and sudo: a login as another user (nobody: its login shell reads
    # only /etc/profile), so the shared state lives in a directory anyone
    # may write, as the node agent's per-container directory is
    ST=$T/st; mkdir -p "$ST"; chmod 1777 "$ST"
    U0=GPU-fa4e0000-0000-4000-8000-000000000000
    U1=GPU-fa4e0000-0000-4000-8000-000000000001
    E=$T/etc1
    mketc "$E" "# written by the Tessera node agent
version=1
state=$ST/state.file
context_reserve=0m
device.0.uuid=$U0
device.0.memory=1m
device.0.sm=0
"
    if ! with_etc "$E" true 2>"$T/err"; then
        echo "FAIL limits-file: cannot lay an overlay over /etc: $(head -c 300 "$T/err")" | tee -a "$LOG"
    else
        # processes without the environment get the limit from the file
        run file-env-i with_etc "$E" env -i LD_LIBRARY_PATH="$FAKE" "$B/client_sym" try $((L + 1)) oom env-i-gets-the-limit
        run file-env-i-exact with_etc "$E" env -i LD_LIBRARY_PATH="$FAKE" "$B/client_sym" try $L ok env-i-limit-exactly-the-file
        run file-su with_etc "$E" su - nobody -s /bin/sh -c "LD_LIBRARY_PATH=$FAKE $B/client_sym try $((L + 1)) oom su-login-gets-the-limit"
        if command -v sudo >/dev/null; then
            run file-sudo with_etc "$E" sudo env LD_LIBRARY_PATH="$FAKE" "$B/client_sym" try $((L + 1)) oom sudo-gets-the-limit
        else
            need sudo-gets-the-limit "sudo (not installed)" "apt-get install sudo (make test installs it when run as root)"
        fi
        # the file is authoritative: the environment cannot raise the limit
        # or move the shared state
        run file-over-env with_etc "$E" env CUDA_DEVICE_MEMORY_LIMIT=1t CUDA_DEVICE_MEMORY_LIMIT_0=1t \
            CUDA_DEVICE_SM_LIMIT=100 CUDA_DEVICE_MEMORY_SHARED_CACHE="$T/state.mine" TESSERA_CONTEXT_RESERVE=0 \
            "$B/client_sym" try $((L + 1)) oom file-wins-over-the-environment
        check "file-state-path-from-the-file" "$([ -e "$ST/state.file" ] && [ ! -e "$T/state.mine" ]; echo $?)"
        # one pool: a holder with the environment and processes without it
        cat >"$T/pool.sh" <<EOS
$B/client_sym hold $((3 * L / 4)) $T/ready.f >/dev/null 2>&1 &
H=\$!
i=0; while [ ! -s $T/ready.f ] && [ \$i -lt 200 ]; do sleep 0.05; i=\$((i + 1)); done
env -i LD_LIBRARY_PATH=$FAKE $B/client_dl try $((L / 2)) oom env-i-counted-in-the-same-pool
su - nobody -s /bin/sh -c "LD_LIBRARY_PATH=$FAKE $B/client_dl try $((L / 4)) ok su-login-gets-the-rest"
kill -9 \$H; wait \$H 2>/dev/null
env -i LD_LIBRARY_PATH=$FAKE $B/client_dl try $L ok pool-whole-after-holder-gone
EOS
        run file-one-pool with_etc "$E" env LD_LIBRARY_PATH="$FAKE" CUDA_DEVICE_MEMORY_LIMIT=1t sh "$T/pool.sh"
        # a container's own preloads beside the limiter's list: the pod's
        # LD_PRELOAD (loaded before the preload list), and its declared
        # preloads written after the limiter in the list (the agent's
        # list for a pod annotated tessera.io/preload): a malloc replacement
        # loads and the file's limit holds
        MI="$B/libtest-malloc.so"
        rm -f "$T/mark"
        # (the sanitizers' runtimes must come first: before the pod's list too)
        run file-ld-preload-interposer with_etc "$E" env LD_PRELOAD="${SANPRE:+$SANPRE }$MI" TEST_MALLOC_MARK="$T/mark" CUDA_DEVICE_MEMORY_LIMIT=1t \
            "$B/client_sym" try $((L + 1)) oom pod-ld-preload-limit-holds
        if [ "${SANITIZE:-0}" != 1 ]; then
            check "file-ld-preload-interposer-loaded" "$([ "$(cat "$T/mark" 2>/dev/null || echo 0)" -gt 0 ]; echo $?)"
        fi
        E4=$T/etc4
        mketc "$E4" "$(cat "$E/tessera/limiter.conf")"
        echo "$MI" >>"$E4/ld.so.preload"
        rm -f "$T/mark"
        run file-declared-preload with_etc "$E4" env -i LD_LIBRARY_PATH="$FAKE" TEST_MALLOC_MARK="$T/mark" "$B/client_sym" try $((L + 1)) oom declared-preload-limit-holds
        run file-declared-preload-exact with_etc "$E4" env -i LD_LIBRARY_PATH="$FAKE" "$B/client_sym" try $L ok declared-preload-limit-exactly
        if [ "${SANITIZE:-0}" != 1 ]; then
            check "file-declared-preload-loaded" "$([ "$(cat "$T/mark" 2>/dev/null || echo 0)" -gt 0 ]; echo $?)"
        fi
        # malformed or unreadable file: fail closed, and say where
        for bad in "version=2" "version=1
state=$T/state.bad
device.0.uuid=GPU-nothex
device.0.memory=1m
device.0.sm=0" "version=1
state=$T/state.bad
device.0.uuid=$U0
device.0.memory=1m
device.0.sm=0
device.0.shares=4" "version=1
device.0.uuid=$U0
device.0.memory=1m
device.0.sm=0" "version=1
state=$T/state.bad
device.0.uuid=$U0
device.0.memory=1024
device.0.sm=0" "version=1
state=$T/state.bad
borrower=00000000000000aa
device.0.uuid=$U0
device.0.memory=4m
device.0.sm=0
device.0.budget=/b
device.0.ceiling=4m" "version=1
state=$T/state.bad
borrower=00000000000000aa
device.0.uuid=$U0
device.0.memory=1m
device.0.sm=0
device.0.ceiling=4m" "version=1
state=$T/state.bad
device.0.uuid=$U0
device.0.memory=1m
device.0.sm=0
device.0.budget=/b
device.0.ceiling=4m"; do
            rm -rf "$T/etcbad"
            mketc "$T/etcbad" "$bad"
            what=$(printf '%s' "$bad" | tail -n 1)
            run "file-malformed ($what)" with_etc "$T/etcbad" env CUDA_DEVICE_MEMORY_LIMIT=1t "$B/client_sym" malformed
            with_etc "$T/etcbad" "$B/client_sym" malformed >/dev/null 2>"$T/err"
            grep -q "limiter.conf" "$T/err"; check "file-malformed ($what): stderr names the file" $? "$(head -c 200 "$T/err")"
        done
        rm -rf "$T/etcdir"; mkdir -p "$T/etcdir/tessera/limiter.conf"; echo "$PRE" | tr ' ' '\n' >"$T/etcdir/ld.so.preload"
        run file-unreadable with_etc "$T/etcdir" "$B/client_sym" malformed
        # devices matched by UUID: the file lists CUDA device 1 first; NVML
        # enumerates them the other way round; a GPU not listed is refused
        E2=$T/etc2
        mketc "$E2" "version=1
state=$T/state.uuid
context_reserve=0m
device.0.uuid=$U1
device.0.memory=2m
device.0.sm=0
device.1.uuid=$U0
device.1.memory=1m
device.1.sm=0
"
        run file-multigpu-by-uuid with_etc "$E2" env FAKE_NVML_ORDER=1,0 TESSERA_CONTEXT_RESERVE=0 "$B/client_sym" multigpu $L
        E3=$T/etc3
        mketc "$E3" "version=1
state=$T/state.one
device.0.uuid=$U0
device.0.memory=64m
device.0.sm=0
"
        run file-unlisted-gpu with_etc "$E3" "$B/client_sym" trydev 1 4096 oom gpu-not-in-the-file-refused
        run file-listed-gpu with_etc "$E3" "$B/client_sym" trydev 0 4096 ok gpu-in-the-file-allowed
        # guaranteed plus burst: a guarantee of L, a ceiling of 4L; past
        # the guarantee only from what the GPU's budget file (the node
        # agent's, read-only in the container) lends, up to the ceiling;
        # within the guarantee whatever the file says
        BU=$T/burst; mkdir -p "$BU"; ME=00000000000000aa
        EB=$T/etcburst
        mketc "$EB" "version=1
state=$T/state.burst
context_reserve=0m
borrower=$ME
device.0.uuid=$U0
device.0.memory=1m
device.0.ceiling=4m
device.0.budget=$BU/$U0
device.0.sm=0
"
        budget() { printf 'version=1\nunguaranteed=%s\n%s' "$1" "$2" >"$BU/$U0"; }
        budget 8m ""
        run burst-to-ceiling with_etc "$EB" "$B/client_sym" try $((4 * L)) ok burst-up-to-the-ceiling-from-the-budget
        run burst-past-ceiling with_etc "$EB" "$B/client_sym" try $((4 * L + 1)) oom burst-refused-past-the-ceiling
        run burst-reports-ceiling with_etc "$EB" "$B/client_sym" meminfo $L $((4 * L)) $((3 * L)) burst-total-is-the-ceiling
        budget 8m "borrower.00000000000000bb=6m
borrower.00000000000000cc=1m
borrower.$ME=3m
"
        run burst-own-entry-not-counted with_etc "$EB" "$B/client_sym" try $((2 * L)) ok burst-only-what-others-leave
        run burst-budget-bounds with_etc "$EB" "$B/client_sym" try $((2 * L + 1)) oom burst-refused-past-the-budget
        run burst-free-is-budget with_etc "$EB" "$B/client_sym" meminfo 0 $((4 * L)) $((2 * L)) burst-free-is-guarantee-plus-budget
        budget 8m "borrower.00000000000000bb=8m
"
        run burst-budget-spent with_etc "$EB" "$B/client_sym" try $((L + 1)) oom burst-refused-when-the-budget-is-spent
        run burst-guarantee-kept with_etc "$EB" "$B/client_sym" try $L ok guarantee-allowed-when-the-budget-is-spent
        # the budget is read again when a charge would not fit: a holder of
        # its guarantee, then another process borrows what was freed
        cat >"$T/burst.sh" <<EOS
$B/client_sym hold $L $T/ready.b >/dev/null 2>&1 &
H=\$!
i=0; while [ ! -s $T/ready.b ] && [ \$i -lt 200 ]; do sleep 0.05; i=\$((i + 1)); done
$B/client_dl try $L oom burst-second-process-refused-while-spent
printf 'version=1\nunguaranteed=8m\nborrower.00000000000000bb=6m\n' >$BU/$U0
$B/client_dl try $((2 * L)) ok burst-second-process-borrows-what-the-budget-lends
$B/client_dl try $((2 * L + 1)) oom burst-container-total-bounded
kill -9 \$H; wait \$H 2>/dev/null; true
EOS
        run burst-processes-share with_etc "$EB" sh "$T/burst.sh"
        rm -f "$BU/$U0"
        run burst-no-budget-file with_etc "$EB" "$B/client_sym" try $((L + 1)) oom burst-nothing-lent-without-a-budget-file
        run burst-no-budget-guarantee with_etc "$EB" "$B/client_sym" try $L ok guarantee-allowed-without-a-budget-file
        printf 'version=1\nunguaranteed=8m\nborrowed=x\n' >"$BU/$U0"
        run burst-bad-budget-file with_etc "$EB" "$B/client_sym" try $((L + 1)) oom burst-nothing-lent-from-a-malformed-budget
        # reclaim on refusal: the GPU (one state file for every process,
        # 16 GiB) is full but for 4 MiB, held by a process no limiter sees
        # (a borrower of another container). An allocation within the
        # guarantee that the driver refuses writes the need file
        # (reclaim=) and is retried until the holder is stopped (here by
        # this script, as the node agent would) or reclaim_wait passes;
        # one past the guarantee is refused at once and asks nothing.
        GS=$T/gpu.reclaim; mkdir -p "$GS"; NEED=$ST/need
        reclaim_etc() { # DIR GUARANTEE CEILING WAIT
            mketc "$1" "version=1
state=$T/state.$(basename "$1")
context_reserve=0m
borrower=$ME
reclaim=$NEED
reclaim_wait=$4
device.0.uuid=$U0
device.0.memory=$2
device.0.sm=0
${3:+device.0.ceiling=$3
device.0.budget=$BU/$U0
}"
        }
        fill_gpu() { # READY: hold all of GPU 0 but 4 MiB, without the limiter
            rm -f "$1"
            env FAKE_GPU_STATE_DIR="$GS" CLIENT_PRIMARY_CONTEXT=1 "$B/client_sym" hold $((16384 * L - 4 * L)) "$1" >/dev/null 2>&1 &
            FILLER=$!
            wait_file "$1"
        }
        ER=$T/etcreclaim; reclaim_etc "$ER" 8m "" 20000ms
        fill_gpu "$T/ready.r1"
        check "reclaim: a borrower fills the GPU" "$(grep -qx 0 "$T/ready.r1"; echo $?)"
        rm -f "$NEED"
        cat >"$T/agent.sh" <<EOS
i=0; while [ ! -e $NEED ] && [ \$i -lt 1000 ]; do sleep 0.02; i=\$((i + 1)); done
cp $NEED $T/need.seen 2>/dev/null
kill -9 $FILLER
EOS
        sh "$T/agent.sh" & AGENT=$!
        run reclaim-retried with_etc "$ER" env FAKE_GPU_STATE_DIR="$GS" CLIENT_PRIMARY_CONTEXT=1 "$B/client_sym" timedtry $((6 * L)) ok 20 \
            refused-within-guarantee-retried-after-reclaim
        kill $AGENT 2>/dev/null; wait $AGENT 2>/dev/null; kill -9 $FILLER 2>/dev/null; wait $FILLER 2>/dev/null
        check "reclaim: the need file names the GPU and the bytes" \
            "$(grep -qx "device=$U0" "$T/need.seen" && grep -qx "bytes=$((6 * L))" "$T/need.seen"; echo $?)" \
            "$(cat "$T/need.seen" 2>/dev/null)"
        # past the guarantee (borrowing from the budget): refused at once
        budget 16384m ""
        EO=$T/etcreclaimover; reclaim_etc "$EO" 2m 8m 20000ms
        fill_gpu "$T/ready.r2"
        rm -f "$NEED"
        run reclaim-not-over-guarantee with_etc "$EO" env FAKE_GPU_STATE_DIR="$GS" CLIENT_PRIMARY_CONTEXT=1 "$B/client_sym" timedtry $((6 * L)) oom 10 \
            refused-past-guarantee-returned-as-before
        check "reclaim: nothing asked past the guarantee" "$([ ! -e "$NEED" ]; echo $?)"
        # no one answers: the refusal comes back once reclaim_wait has passed
        EW=$T/etcreclaimwait; reclaim_etc "$EW" 8m "" 500ms
        run reclaim-wait-bounded with_etc "$EW" env FAKE_GPU_STATE_DIR="$GS" CLIENT_PRIMARY_CONTEXT=1 "$B/client_sym" timedtry $((6 * L)) oom 10 \
            refused-within-guarantee-after-reclaim-wait 0.5
        check "reclaim: asked before giving up" "$(grep -qx "device=$U0" "$NEED"; echo $?)"
        kill -9 $FILLER 2>/dev/null; wait $FILLER 2>/dev/null
    fi

    # hole 4: a holder SIGKILLed in the old pid namespace of a container;
    # the restarted container (a new pid namespace) gets its whole limit
    S=$(state restart); rm -f "$T/ready"
    unshare -p -f --kill-child=SIGKILL env CUDA_DEVICE_MEMORY_SHARED_CACHE="$S" LD_PRELOAD="$PRE" \
        CUDA_DEVICE_MEMORY_LIMIT=$L TESSERA_CONTEXT_RESERVE=0 "$B/client_sym" hold $((3 * L / 4)) "$T/ready" >/dev/null 2>&1 &
    U=$!
    wait_file "$T/ready"
    check "restart: holder in a pid namespace allocated 3/4 L" "$(grep -qx 0 "$T/ready"; echo $?)"
    run restart-live-holder-counts unshare -p -f env CUDA_DEVICE_MEMORY_SHARED_CACHE="$S" LD_PRELOAD="$PRE" \
        CUDA_DEVICE_MEMORY_LIMIT=$L TESSERA_CONTEXT_RESERVE=0 "$B/client_dl" try $((L / 2)) oom \
        other-pid-namespace-live-holder-counts
    # The holder (the namespace's pid 1, a child of unshare) dies by its
    # parent-death signal, asynchronously: wait until it has exited (its
    # lock on the state file goes with it) before the restarted container
    # runs, or a loaded machine sees it still alive.
    H=$(cut -d" " -f1 "/proc/$U/task/$U/children" 2>/dev/null)
    kill -9 $U; wait $U 2>/dev/null
    for _ in $(seq 200); do
        [ -z "$H" ] || [ ! -e "/proc/$H" ] || [ "$(awk '{print $3}' "/proc/$H/stat" 2>/dev/null)" = Z ] && break
        sleep 0.05
    done
    run restart-full-limit unshare -p -f env CUDA_DEVICE_MEMORY_SHARED_CACHE="$S" LD_PRELOAD="$PRE" \
        CUDA_DEVICE_MEMORY_LIMIT=$L TESSERA_CONTEXT_RESERVE=0 "$B/client_dl" timedtry $L ok 3 \
        restarted-container-gets-its-whole-limit
fi
