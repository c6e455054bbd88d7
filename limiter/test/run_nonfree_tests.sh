# run_nonfree_tests.sh - sourced by run_tests.sh: the limiter with the real
# NVIDIA binaries of Debian 12's non-free component (no GPU): the CUDA 11.8
# runtime (libcudart11.0), driver 535's libcuda and NVML, nvidia-smi.
# fetch_nonfree.sh puts them in $NONFREE; CI runs it.

if [ ! -f "$NONFREE/.complete" ]; then
    need nonfree "NVIDIA's CUDA runtime, libcuda, NVML and nvidia-smi (Debian non-free) in $NONFREE" \
        "run limiter/test/fetch_nonfree.sh (make test does; root, or apt sources with contrib non-free)"
else
    echo "# nonfree: $(tr '\n' ';' <"$NONFREE/VERSIONS")" | tee -a "$LOG"
    RT=$NONFREE/cudart/libcudart.so.11.0
    gcc -O1 -o "$T/rt_probe" "$SRC/test/rt_probe.c" -ldl
    # 1. the real runtime over the fake driver, limiter preloaded: cudart
    # fetches every entry point through cuGetProcAddress, each with the
    # version of the variant it wants (e.g. cuDevicePrimaryCtxRelease 7000,
    # the v1 function); the fake answers those it does not implement with
    # stubs. It stops at cuGetExportTable (the driver's internal, undocumented
    # tables, which a fake cannot provide): cudaGetDeviceCount fails.
    rm -f "$T/gpa.log"
    env FAKE_GPA_LOG="$T/gpa.log" FAKE_GPA_STUBS=1 TESSERA_LIMITER_DEBUG=1 LD_LIBRARY_PATH="$NONFREE/cudart:$FAKE" \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$(state rt)" CUDA_DEVICE_MEMORY_LIMIT=$L LD_PRELOAD="$PRE" \
        "$T/rt_probe" "$RT" >"$T/rt.out" 2>"$T/rt.err"
    rc=$?
    echo "# cudart 11.8 over the fake: $(tr '\n' ' ' <"$T/rt.out")" | tee -a "$LOG"
    check "cudart-over-fake-runs-with-the-limiter, stops at cuGetExportTable" "$([ $rc -eq 0 ] &&
        grep -q '^count [1-9]' "$T/rt.out" && grep -q '^#export-table' "$T/gpa.log"; echo $?)" \
        "rc=$rc $(head -c 300 "$T/rt.err")"
    n=$(grep -c '(intercepted)' "$T/rt.err")
    echo "# cudart 11.8 asked $(grep -vc '^#' "$T/gpa.log") entry points; $n came back intercepted; then export table $(grep '^#export' "$T/gpa.log" | head -1 | cut -d' ' -f2)" | tee -a "$LOG"
    grep -q 'cuGetProcAddress(cuGetProcAddress, 11030, 0) -> cuGetProcAddress (intercepted)' "$T/rt.err" &&
        grep -q 'cuGetProcAddress(cuDevicePrimaryCtxRelease, 7000, 0) -> cuDevicePrimaryCtxRelease (intercepted)' "$T/rt.err" &&
        [ "$n" -ge 40 ]
    check "cudart-entry-points-intercepted (cuGetProcAddress itself, v1 primary release)" $?
    run cudart-requests-replayed lim "$(state rp)" CUDA_DEVICE_MEMORY_LIMIT=$L FAKE_GPA_STUBS=1 "$B/client_dl" \
        gpareplay "$T/gpa.log"
    # 2. the real driver library (no GPU: cuInit fails, cuGetProcAddress
    # works): for every hooked name, version 11.0 .. 12.2 and flag, the
    # limiter hands out its hook of exactly the variant the driver does
    LD_LIBRARY_PATH="$NONFREE/driver" "$B/client_dl" gpadump 12020 >"$T/real.gpa" 2>"$T/err"
    check "real-libcuda-answers-cuGetProcAddress" "$([ -s "$T/real.gpa" ]; echo $?)" "$(head -c 300 "$T/err")"
    run real-libcuda-variants env LD_LIBRARY_PATH="$NONFREE/driver" CUDA_DEVICE_MEMORY_SHARED_CACHE="$(state rd)" \
        CUDA_DEVICE_MEMORY_LIMIT=$L LD_PRELOAD="$PRE" "$B/client_dl" gpacheck "$T/real.gpa"
    # 3. the real runtime over the real driver library: cuInit finds no
    # device (100) and the runtime says so, through the limiter's hooks
    env TESSERA_LIMITER_DEBUG=1 LD_LIBRARY_PATH="$NONFREE/cudart:$NONFREE/driver" \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$(state rr)" CUDA_DEVICE_MEMORY_LIMIT=$L LD_PRELOAD="$PRE" \
        "$T/rt_probe" "$RT" >"$T/rt.out" 2>"$T/rt.err"
    rc=$?
    echo "# cudart 11.8 over driver 535 (no GPU): $(tr '\n' ' ' <"$T/rt.out")" | tee -a "$LOG"
    check "cudart-over-real-driver-through-the-limiter" "$([ $rc -eq 0 ] && grep -q '^count 100' "$T/rt.out" &&
        grep -q 'cuGetProcAddress(cuInit, 2000, 0) -> cuInit (intercepted)' "$T/rt.err"; echo $?)" \
        "rc=$rc $(head -c 300 "$T/rt.err")"
    # 4. nvidia-smi: over the real NVML it fails the same way with and
    # without the limiter (no driver); over the fake NVML it stops at
    # nvmlInternalGetExportTable (internal, docs/isolation.md)
    LD_LIBRARY_PATH="$NONFREE/driver" "$NONFREE/bin/nvidia-smi" >"$T/smi.a" 2>&1; ra=$?
    env LD_LIBRARY_PATH="$NONFREE/driver" CUDA_DEVICE_MEMORY_SHARED_CACHE="$(state smi)" CUDA_DEVICE_MEMORY_LIMIT=$L \
        LD_PRELOAD="$PRE" "$NONFREE/bin/nvidia-smi" >"$T/smi.b" 2>&1; rb=$?
    check "nvidia-smi-real-nvml-same-with-the-limiter (exit $ra)" "$([ $ra -eq $rb ] && cmp -s "$T/smi.a" "$T/smi.b"; echo $?)" \
        "$(head -c 200 "$T/smi.b")"
    # 5. every entry point the limiter intercepts exists in the real
    # libraries (except those newer than driver 535)
    missing=""
    for n in $(nm -D "$B/libtessera-limiter.so" | awk '$2 == "T" && $3 ~ /^(cu|nvml)/ {print $3}'); do
        case $n in cuCtxCreate_v4|nvmlDeviceGetProcessesUtilizationInfo) continue ;; esac
        lib=$NONFREE/driver/libcuda.so.1
        case $n in nvml*) lib=$NONFREE/driver/libnvidia-ml.so.1 ;; esac
        nm -D "$lib" | grep -q " T $n\$" || missing="$missing $n"
    done
    check "intercepted-names-exist-in-driver-535" "$([ -z "$missing" ]; echo $?)" "$missing"
fi
