package main

import (
	"bytes"
	"strings"
	"testing"
)

// The simulator left the daemon: `tessera simulate` says where it went.
func TestSimulateMovedToTesseraSim(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"simulate", "--seeds", "1"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "tessera-sim") {
		t.Errorf("tessera simulate: exit %d, stderr %q, want 2 and a pointer to tessera-sim", code, errOut.String())
	}
	errOut.Reset()
	if code := run(t.Context(), []string{"--help"}, &out, &errOut); code != 0 || strings.Contains(errOut.String(), "simulate") {
		t.Errorf("tessera --help: exit %d, lists %q", code, errOut.String())
	}
}
