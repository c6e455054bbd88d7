package cli

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
)

func TestParseFlagsAndExitCode(t *testing.T) {
	newFS := func() *flag.FlagSet {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.Int("n", 1, "")
		return fs
	}
	if err := ParseFlags(newFS(), []string{"-n", "3"}); err != nil {
		t.Fatal(err)
	}
	for args, want := range map[string]string{
		"-n x":       `usage: invalid value "x" for flag -n`,
		"-m 1":       "usage: flag provided but not defined: -m",
		"-n 1 extra": `usage: unexpected arguments ["extra"]`,
	} {
		err := ParseFlags(newFS(), strings.Fields(args))
		if err == nil || !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want a usage error containing %q", args, err, want)
		}
		var out bytes.Buffer
		if code := ExitCode(&out, "prog", "cmd", err); code != 2 || !strings.HasPrefix(out.String(), "prog cmd: usage: ") {
			t.Errorf("%q: exit %d, printed %q", args, code, out.String())
		}
	}
	help := ParseFlags(newFS(), []string{"-h"})
	if !errors.Is(help, flag.ErrHelp) || ExitCode(io.Discard, "p", "c", help) != 0 {
		t.Errorf("-h: %v", help)
	}
	var out bytes.Buffer
	if code := ExitCode(&out, "p", "c", errors.New("boom")); code != 1 || out.String() != "p c: boom\n" {
		t.Errorf("plain error: exit %d, printed %q", code, out.String())
	}
	out.Reset()
	if code := ExitCode(&out, "p", "", errors.New("boom")); code != 1 || out.String() != "p: boom\n" {
		t.Errorf("a program without subcommands: exit %d, printed %q", code, out.String())
	}
	if code := ExitCode(&out, "p", "c", nil); code != 0 {
		t.Errorf("no error: exit %d", code)
	}
}
