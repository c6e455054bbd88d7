package lab

import (
	"os"

	"github.com/tessera-gpu/tessera/internal/nodeagent/mps/mpsfake"
)

// MPSControlComponent is the lab's stand-in for nvidia-cuda-mps-control
// (mpsfake), run as `tessera-lab component mps-control [-d|-f]`; the node
// agents of the mps mode's nodes start it.
const MPSControlComponent = "mps-control"

// runMPSControl is the fake nvidia-cuda-mps-control.
func runMPSControl(args []string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if code := mpsfake.Main([]string{exe, ComponentCommand, MPSControlComponent}, args, os.Stdin, os.Stdout); code != 0 {
		os.Exit(code)
	}
	return nil
}
