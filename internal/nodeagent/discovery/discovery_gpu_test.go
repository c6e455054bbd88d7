//go:build gpu

// Discovery and the health monitor on a real GPU, with the real NVML,
// checked against nvidia-smi. Built only with -tags gpu (hack/gpu-node-check.sh
// runs it on a machine with a GPU; `make test` never builds it):
//
//	go test -tags gpu -run TestDiscoverOnGPU -v ./internal/nodeagent/discovery/

package discovery

import (
	"context"
	"encoding/json"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/internal/nodeagent/health"
)

func TestDiscoverOnGPU(t *testing.T) {
	lib, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Shutdown()
	res, err := Discover(lib, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range res.Skipped {
		t.Errorf("skipped: %v", s)
	}
	out, err := exec.Command("nvidia-smi", "--query-gpu=index,uuid,name,memory.total,pci.bus_id,compute_cap,mig.mode.current",
		"--format=csv,noheader,nounits").Output()
	if err != nil {
		t.Fatalf("nvidia-smi: %v", err)
	}
	rows := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(rows) != len(res.Devices) {
		t.Fatalf("nvidia-smi lists %d GPUs, discovery %d", len(rows), len(res.Devices))
	}
	handles := map[string]nvml.Device{}
	for i, row := range rows {
		f := strings.Split(row, ", ")
		if len(f) != 7 {
			t.Fatalf("nvidia-smi row %q", row)
		}
		g := res.Devices[i].GPU
		j, _ := json.Marshal(g)
		t.Logf("GPU %d: %s", i, j)
		mem, _ := strconv.ParseInt(f[3], 10, 64)
		want := map[string][2]string{
			"index":              {f[0], strconv.Itoa(g.Index)},
			"uuid":               {f[1], g.UUID},
			"name":               {f[2], g.Model},
			"memory.total (MiB)": {strconv.FormatInt(mem, 10), strconv.FormatInt(g.MemoryMiB, 10)},
			"pci.bus_id":         {NormalizeBusID(f[4]), g.PCIBusID},
			"compute_cap":        {f[5], g.ComputeCapability},
			"mig.mode.current":   {map[bool]string{true: "Enabled", false: "Disabled"}[g.MIG.Enabled], f[6]},
		}
		if !g.MIG.Capable {
			want["mig.mode.current"] = [2]string{"[N/A]", f[6]}
		}
		for k, v := range want {
			if v[0] != v[1] {
				t.Errorf("GPU %d %s: nvidia-smi %q, discovery %q", i, k, v[0], v[1])
			}
		}
		if g.SMCount <= 0 {
			t.Errorf("GPU %d (%s): SM count unknown", i, g.Model)
		}
		if known := KnownSMCount(g.Model); known != 0 && known != g.SMCount {
			t.Errorf("GPU %d (%s): SM count %d, the model table says %d", i, g.Model, g.SMCount, known)
		}
		if g.MIG.Capable && res.Devices[i].MIG == nil {
			t.Errorf("GPU %d (%s, %d MiB): MIG capable but no MIG geometry for the model", i, g.Model, g.MemoryMiB)
		}
		handles[g.UUID] = res.Devices[i].Handle
	}

	// The health monitor registers for XID events on the real driver and
	// keeps an idle GPU healthy.
	m := health.New(lib, handles, health.Options{IgnoredXIDs: []uint64{13, 31, 43, 45, 68, 109}, WaitTimeout: time.Second},
		ktesting.NewLogger(t, ktesting.NewConfig()))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := m.Run(ctx); err != nil {
		t.Fatalf("health monitor: %v", err)
	}
	for u, s := range m.Snapshot() {
		if !s.Healthy {
			t.Errorf("GPU %s unhealthy after 3 s idle: %s", u, s.Reason)
		}
		t.Logf("GPU %s: healthy %v, XID events %d", u, s.Healthy, s.XIDErrors)
	}
}
