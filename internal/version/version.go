// Package version holds the build's version, set at link time with
// -ldflags "-X github.com/tessera-gpu/tessera/internal/version.Version=v0.1.0".
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the release this binary was built from; "dev" for local builds.
var Version = "dev"

// String describes the build: version, VCS revision when known, Go version.
func String() string {
	rev := ""
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = " (" + s.Value[:12] + ")"
			}
		}
	}
	return fmt.Sprintf("tessera %s%s %s %s/%s", Version, rev, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
