package component

import (
	"os"

	"github.com/tessera-gpu/tessera/internal/nodeagent/mps/mpsfake"
)

// runMPSControl is the fake nvidia-cuda-mps-control.
func runMPSControl(args []string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if code := mpsfake.Main([]string{exe, Command, MPSControl}, args, os.Stdin, os.Stdout); code != 0 {
		os.Exit(code)
	}
	return nil
}
