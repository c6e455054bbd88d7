package component

import (
	"flag"
	"os"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/internal/lab/fakegpu"
	"github.com/tessera-gpu/tessera/internal/lab/nvmlemu"
	"github.com/tessera-gpu/tessera/internal/nodeagent/memlimits"
)

// runMemoryLimits is `tessera memory-limits` over a node's emulated NVML
// (whose driver partitions memory: the fake GPUs' table of limits):
// the node's flags, "--", then the hook's own.
func runMemoryLimits(args []string) error {
	fs := flag.NewFlagSet(MemoryLimits, flag.ContinueOnError)
	model := fs.String("model", "", "the node's GPU model")
	gpus := fs.Int("gpus", 0, "the node's GPUs")
	node := fs.String("node", "", "the node's name")
	dir := fs.String("gpu-dir", "", "the node's fake GPUs' state files")
	if err := fs.Parse(args); err != nil {
		return err
	}
	open := func(string) (nvml.Interface, error) {
		lib, err := nvmlemu.NewModel(*model, *gpus, *node)
		if err != nil {
			return nil, err
		}
		lib.UsePartitioning(&fakegpu.Node{Dir: *dir}, fakegpu.NVMLCodes)
		return lib, nil
	}
	return memlimits.HookCommand(fs.Args(), open, os.Stdin, os.Stderr)
}
