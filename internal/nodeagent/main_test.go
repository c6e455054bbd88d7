package nodeagent

import (
	"os"

	"github.com/tessera-gpu/tessera/internal/nodeagent/mps/mpsfake"
)

// fakeMPS makes the test binary the fake MPS control daemon when
// TESSERA_FAKE_MPS=1 (tests of MPS nodes run it as nvidia-cuda-mps-control).
func fakeMPS() {
	if os.Getenv("TESSERA_FAKE_MPS") == "1" {
		os.Exit(mpsfake.Main([]string{os.Args[0]}, os.Args[1:], os.Stdin, os.Stdout))
	}
}
