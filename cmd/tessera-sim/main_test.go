package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The grid's flags: --grid runs the mixes (fgd and tessera by default) and
// refuses --variant; the grid-only flags are refused without --grid;
// unknown mixes and policies are named.
func TestSimulateGridFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--grid", "--variant", "gpushare40"}, "--grid runs its own mixes"},
		{[]string{"--grid-seeds", "2"}, "--grid-seeds applies only with --grid"},
		{[]string{"--grid", "--grid-mixes", "gpushare40,bogus7"}, `unknown variant "bogus7"`},
		{[]string{"--grid", "--policy", "fdg"}, `unknown policy "fdg"`},
	} {
		var out, errOut bytes.Buffer
		err := runSimulate(t.Context(), c.args, &out, &errOut)
		if err == nil || !errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want a usage error containing %q", c.args, err, c.want)
		}
	}
	// A small trace: two 2-GPU nodes, whole GPUs, shares, CPU-only tasks.
	dir := t.TempDir()
	nodes, pods := filepath.Join(dir, "nodes.csv"), filepath.Join(dir, "pods.csv")
	var pb strings.Builder
	pb.WriteString("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n")
	for i, k := range strings.Split(strings.Repeat("1,1000 1,500 0,0 ", 10), " ") {
		if k != "" {
			fmt.Fprintf(&pb, "p%02d,1000,1024,%s\n", i, k)
		}
	}
	if err := os.WriteFile(nodes, []byte("sn,cpu_milli,memory_mib,gpu,model\na,32000,65536,2,T4\nb,32000,65536,2,T4\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pods, []byte(pb.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	args := []string{"--grid", "--grid-mixes", "cpu100", "--grid-seeds", "1", "--seeds", "1", "--format", "csv", "--nodes", nodes, "--pods", pods}
	if err := runSimulate(t.Context(), args, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "mix,policy,arrived_pct") || !strings.Contains(out.String(), "cpu100,fgd,100.0000") || !strings.Contains(out.String(), "cpu100,tessera,130.0000") {
		t.Errorf("grid CSV:\n%s", out.String())
	}
}
