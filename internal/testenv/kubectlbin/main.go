// Command kubectlbin is kubectl, built from the pinned k8s.io/kubectl
// module, for tests that drive the emulated cluster as a user would
// (testenv.BuildKubectl). Built without cgo, like the released kubectl.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		util.CheckErr(err) // prints the error as kubectl does, exits 1
	}
	os.Exit(0)
}
