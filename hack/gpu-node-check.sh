#!/usr/bin/env bash
# gpu-node-check.sh - the node agent's GPU-facing parts on a real NVIDIA GPU:
# NVML discovery and the XID health monitor checked against nvidia-smi
# (internal/nodeagent/discovery/discovery_gpu_test.go), and the MPS daemon
# manager with NVIDIA's nvidia-cuda-mps-control and real PyTorch clients
# (internal/nodeagent/mps/mps_gpu_test.go: a 30 % / 4 GiB tile, and a
# client whose own CUDA_MPS_* variables ask for more). Changes no GPU
# setting (MIG mode, compute mode); the MPS daemon is quit at the end.
#
#   bash hack/gpu-node-check.sh             # builds the two test binaries (needs Go)
#   BIN=dir bash hack/gpu-node-check.sh     # binaries built elsewhere:
#       go test -tags gpu -c -o dir/discovery.test ./internal/nodeagent/discovery/
#       go test -tags gpu -c -o dir/mps.test ./internal/nodeagent/mps/
#
# Exit status: 0 both passed, 1 one failed.
set -u
cd "$(dirname "$0")/.."
if [ -z "${BIN:-}" ]; then
    BIN=$(mktemp -d)
    trap 'rm -rf "$BIN"' EXIT # ours: removed at the end
    go test -tags gpu -c -o "$BIN/discovery.test" ./internal/nodeagent/discovery/ &&
        go test -tags gpu -c -o "$BIN/mps.test" ./internal/nodeagent/mps/ || exit 1
fi
rc=0
echo "== NVML discovery and health"
"$BIN/discovery.test" -test.run TestDiscoverOnGPU -test.v -test.timeout 60s || rc=1
echo "== MPS"
"$BIN/mps.test" -test.run TestMPSOnGPU -test.v -test.timeout 240s || rc=1
exit $rc
