package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
	"github.com/tessera-gpu/tessera/pkg/api"
)

func TestNodeAgentUsageErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--config-map=nons"}, `--config-map "nons": want "namespace/name"`},
		{[]string{"--ignore-xids=13,x"}, `--ignore-xids: XID "x" is not a non-negative integer`},
		{[]string{"--resource-prefix=Bad"}, `--resource-prefix: resource prefix "Bad"`},
		{[]string{"--recovery-period=-1s"}, `--recovery-period -1s is negative`},
		{[]string{"--profile=p.yaml"}, `--profile is for --discover-only`},
		{[]string{"extra"}, `unexpected arguments ["extra"]`},
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append([]string{"node-agent"}, tt.args...), &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q", tt.args, code, errOut.String(), tt.want)
		}
	}
}

func TestDiscoverOnlyOutput(t *testing.T) {
	var out bytes.Buffer
	if err := discoverOnlyMode(nvmltest.DGXH100(), "", api.DefaultResourceNames, &out); err != nil {
		t.Fatal(err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, out.Bytes()); err != nil {
		t.Fatal(err)
	}
	inv, err := api.DecodeInventory(compact.Bytes())
	if err != nil {
		t.Fatalf("discover-only output is not an inventory: %v\n%s", err, out.String())
	}
	if len(inv.GPUs) != 8 || inv.GPUs[0].MaxShares != api.DefaultSharesPerGPU || inv.GPUs[0].SMCount != 132 {
		t.Errorf("%+v", inv.GPUs[0])
	}

	p := filepath.Join(t.TempDir(), "profile.yaml")
	if err := os.WriteFile(p, []byte("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := discoverOnlyMode(nvmltest.DGXA100(), p, api.DefaultResourceNames, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"sharing": "time-slicing"`) || !strings.Contains(out.String(), `"maxShares": 3`) {
		t.Errorf("profile not applied:\n%s", out.String())
	}
}
