package cinit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	ok := Spec{Scratch: "/run/x", Argv: []string{"sh"}, Mounts: []Mount{{Source: "/a", Target: "/b"}}, Hide: []string{"/lab"}, Cwd: "/w"}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		s   Spec
		msg string
	}{
		"relative scratch": {Spec{Scratch: "x", Argv: []string{"sh"}}, "not an absolute path"},
		"no command":       {Spec{Scratch: "/x"}, "no command"},
		"empty command":    {Spec{Scratch: "/x", Argv: []string{""}}, "no command"},
		"relative mount":   {Spec{Scratch: "/x", Argv: []string{"sh"}, Mounts: []Mount{{Source: "a", Target: "/b"}}}, "must be absolute"},
		"mount on root":    {Spec{Scratch: "/x", Argv: []string{"sh"}, Mounts: []Mount{{Source: "/a", Target: "/"}}}, "root is not supported"},
		"hide root":        {Spec{Scratch: "/x", Argv: []string{"sh"}, Hide: []string{"/"}}, "want an absolute path below /"},
		"relative cwd":     {Spec{Scratch: "/x", Argv: []string{"sh"}, Cwd: "w"}, "working directory"},
	} {
		if err := c.s.Validate(); err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want an error containing %q", name, err, c.msg)
		}
	}
}

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "tool")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"HOME=/", "PATH=/nonexistent:" + dir}
	if p, err := LookPath("tool", env); err != nil || p != exe {
		t.Errorf("LookPath(tool) = %q, %v; want %s from the container's PATH", p, err, exe)
	}
	if p, err := LookPath(exe, nil); err != nil || p != exe {
		t.Errorf("LookPath(%s) = %q, %v", exe, p, err)
	}
	for _, name := range []string{"data", "python"} {
		if _, err := LookPath(name, env); err == nil || !strings.Contains(err.Error(), `exec: "`+name+`": executable file not found in $PATH`) {
			t.Errorf("LookPath(%s): %v, want the runtime's not-found message", name, err)
		}
	}
	if _, err := LookPath("tool", []string{"PATH="}); err == nil {
		t.Error("LookPath found a command with an empty PATH")
	}
}
