package migmgr

import (
	"errors"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/internal/mig"
	"github.com/tessera-gpu/tessera/internal/nodeagent/config"
	"github.com/tessera-gpu/tessera/internal/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
)

const layouts = `version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.5gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 7
  all-2g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "2g.10gb": 3
  first-only:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "3g.20gb": 2
  too-much:
    - devices: all
      mig-enabled: true
      mig-devices:
        "4g.20gb": 1
        "2g.10gb": 2
`

func setup(t *testing.T, model string, gpus int) (*nvmltest.Node, []discovery.Device, map[string]config.Layout) {
	t.Helper()
	n, err := nvmltest.NewModel(model, gpus, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	res, err := discovery.Discover(n, discovery.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ls, err := config.ParseMIGParted([]byte(layouts))
	if err != nil {
		t.Fatal(err)
	}
	return n, res.Devices, ls
}

// TestApplyGuideLayouts applies the guides' layouts to an A100-40GB and
// reads back the MIG devices NVIDIA's plugin would offer.
func TestApplyGuideLayouts(t *testing.T) {
	_, devs, ls := setup(t, "A100-40GB", 2)
	for _, tc := range []struct {
		layout string
		want   string
	}{
		{"all-1g.5gb", "1g.5gb@0 1g.5gb@1 1g.5gb@2 1g.5gb@3 1g.5gb@4 1g.5gb@5 1g.5gb@6"},
		{"all-2g.10gb", "2g.10gb@0 2g.10gb@2 2g.10gb@4"},
		{"all-disabled", ""},
	} {
		l := ls[tc.layout]
		for i := range devs {
			r := Apply(&devs[i], &l)
			if r.Err != nil || !r.Changed {
				t.Fatalf("%s: %v", tc.layout, r)
			}
			var got []string
			for _, m := range devs[i].MIGDevices {
				got = append(got, m.Profile+"@"+itoa(m.Start))
				if !strings.HasPrefix(m.UUID, "MIG-") || m.MemoryMiB == 0 || m.SMCount == 0 {
					t.Errorf("%s: MIG device %+v", tc.layout, m.MIGDevice)
				}
			}
			if strings.Join(got, " ") != tc.want || devs[i].GPU.MIG.Enabled != (tc.want != "") {
				t.Errorf("%s GPU %d: %v (MIG %v), want %s", tc.layout, i, got, devs[i].GPU.MIG.Enabled, tc.want)
			}
			if again := Apply(&devs[i], &l); again.Changed || again.Err != nil {
				t.Errorf("%s applied twice: %v", tc.layout, again)
			}
		}
	}
}

func itoa(i int) string { return string(rune('0' + i)) }

// TestApplyReports: a GPU the layout's entry does not name is left alone,
// a layout that does not fit is reported, a busy device blocks a change,
// a mode change that needs a reset is reported as pending.
func TestApplyReports(t *testing.T) {
	n, devs, ls := setup(t, "A100-40GB", 2)
	l := ls["first-only"]
	if r := Apply(&devs[0], &l); r.Err != nil || len(devs[0].MIGDevices) != 2 {
		t.Fatalf("GPU 0: %v, %d devices", r, len(devs[0].MIGDevices))
	}
	if r := Apply(&devs[1], &l); r.Err != nil || r.Changed || !strings.Contains(r.Message, "no entry of layout first-only applies") {
		t.Errorf("GPU 1: %v", r)
	}
	bad := ls["too-much"]
	if r := Apply(&devs[1], &bad); r.Err == nil || !strings.Contains(r.Err.Error(), "does not fit one A100-40GB") {
		t.Errorf("too-much: %v", r)
	}
	n.SetBusy(devs[0].MIGDevices[0].UUID, true)
	other := ls["all-1g.5gb"]
	if r := Apply(&devs[0], &other); !errors.Is(r.Err, ErrBusy) || !strings.Contains(r.Err.Error(), devs[0].MIGDevices[0].UUID) {
		t.Errorf("busy: %v", r)
	}
	if len(devs[0].MIGDevices) != 2 {
		t.Errorf("a busy GPU was changed: %v", devs[0].MIGDevices)
	}
	n.SetBusy(devs[0].MIGDevices[0].UUID, false)

	m, devs2, _ := setup(t, "H100-80GB", 1)
	m.SetResetRequired(true)
	if r := Apply(&devs2[0], &other); !errors.Is(r.Err, ErrResetRequired) {
		t.Fatalf("reset: %v", r)
	}
	if !devs2[0].MIGPending || devs2[0].GPU.MIG.Enabled {
		t.Errorf("pending %v enabled %v", devs2[0].MIGPending, devs2[0].GPU.MIG.Enabled)
	}
	// all-1g.5gb names an A100-40GB profile: on an H100 it does not fit.
	m.ResetGPU(0)
	if r := Apply(&devs2[0], &other); r.Err == nil || !strings.Contains(r.Err.Error(), `has no profile "1g.5gb"`) {
		t.Errorf("H100 after reset: %v", r)
	}
}

// TestCreateDestroy is dynamic MIG's use: single instances made and
// removed, busy ones kept.
func TestCreateDestroy(t *testing.T) {
	n, devs, _ := setup(t, "A100-40GB", 1)
	d := &devs[0]
	if _, err := Create(d.Handle, d.MIG, mig.Instance{Profile: "1g.5gb", Start: 0}); err == nil {
		t.Fatal("instance created with MIG mode off")
	}
	if err := setMode(d.Handle, true); err != nil {
		t.Fatal(err)
	}
	u, err := Create(d.Handle, d.MIG, mig.Instance{Profile: "3g.20gb", Start: 4})
	if err != nil || !strings.HasPrefix(u, "MIG-") {
		t.Fatalf("%s %v", u, err)
	}
	if _, err := Create(d.Handle, d.MIG, mig.Instance{Profile: "1g.5gb", Start: 5}); err == nil {
		t.Error("overlapping instance created")
	}
	if err := d.RefreshMIG(); err != nil || len(d.MIGDevices) != 1 || d.MIGDevices[0].UUID != u {
		t.Fatalf("%v %v", d.MIGDevices, err)
	}
	n.SetBusy(u, true)
	if err := Destroy(d, mig.Instance{Profile: "3g.20gb", Start: 4}); !errors.Is(err, ErrBusy) {
		t.Errorf("busy destroy: %v", err)
	}
	n.SetBusy(u, false)
	if err := Destroy(d, mig.Instance{Profile: "3g.20gb", Start: 4}); err != nil {
		t.Fatal(err)
	}
	if got := n.MIGInstances(0); len(got) != 0 {
		t.Errorf("left %v", got)
	}
}
