// Package cli holds what Tessera's binaries (tessera, tessera-lab,
// tessera-sim) share in handling subcommand flags and errors.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// ErrUsage marks errors whose message is about how the command was
// called (exit code 2).
var ErrUsage = errors.New("usage")

// ParseFlags parses a subcommand's flags, which take no positional
// arguments, and marks every mistake as a usage error.
func ParseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", ErrUsage, fs.Args())
	}
	return nil
}

// ExitCode reports a subcommand's error on stderr as "prog cmd: err"
// ("prog: err" for a program without subcommands, cmd "") and returns the
// process's exit code: 0 for none or -h, 2 for a usage error, 1
// otherwise.
func ExitCode(stderr io.Writer, prog, cmd string, err error) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if cmd != "" {
		prog += " " + cmd
	}
	fmt.Fprintf(stderr, "%s: %v\n", prog, err)
	if errors.Is(err, ErrUsage) {
		return 2
	}
	return 1
}
