package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/tessera-gpu/tessera/internal/atomicfile"
)

// LimiterImagePath is where the image keeps the limiter library
// (hack/images puts it there; its smoke test runs install-limiter with
// this default).
const LimiterImagePath = "/usr/local/lib/tessera/libtessera-limiter.so"

// HookImagePath is where the image keeps tessera-hook, the OCI hook the
// node agent injects into GPU containers where the driver holds their
// memory limits (the container runtime runs it on the host).
const HookImagePath = "/usr/local/lib/tessera/tessera-hook"

// runInstallLimiter copies the limiter library onto the host: the node
// agent's init container, in an image without a shell.
func runInstallLimiter(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("install-limiter", flag.ContinueOnError)
	fs.SetOutput(stderr)
	from := fs.String("from", LimiterImagePath, "the limiter library to install")
	to := fs.String("to", "", "where to install it (a host path mounted into the container); its directory must exist")
	hookFrom := fs.String("hook-from", HookImagePath, "tessera-hook, the OCI hook the node agent injects into GPU containers")
	hookTo := fs.String("hook-to", "", "where to install tessera-hook on the host (the node agent's --memory-limits-hook); empty: not installed")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: tessera install-limiter --to PATH [flags]\n\nCopies the limiter library to PATH atomically: a new file beside it, renamed over it, so that containers running with the old library keep theirs.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *to == "" {
		return fmt.Errorf("%w: --to is required", errUsage)
	}
	if err := installFile(*from, *to, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "installed %s at %s\n", *from, *to)
	if *hookTo != "" {
		if err := installFile(*hookFrom, *hookTo, 0o755); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "installed %s at %s\n", *hookFrom, *hookTo)
	}
	return nil
}

// installFile copies from to to with atomicfile: a reader sees the old
// file or the whole new one, and processes that have the old one mapped
// keep it (a new inode is renamed over the name).
func installFile(from, to string, mode os.FileMode) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	dir := filepath.Dir(to)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("--to %s: directory %s does not exist (mount the host directory there)", to, dir)
	}
	if err := atomicfile.Write(to, b, mode); err != nil {
		return fmt.Errorf("installing %s at %s: %w", from, to, err)
	}
	return nil
}
