package memlimits

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/tessera-gpu/tessera/internal/cgroup2"
)

// TestDetect: a GPU's memory can be partitioned by its driver only from
// r615 on, with both NVML calls exported, a cgroup v2 hierarchy, MIG off,
// and the driver answering for the hierarchy's root group; each refusal
// says why.
func TestDetect(t *testing.T) {
	mount := cgroup2.Mount{Point: "/sys/fs/cgroup", Root: "/"}
	missing := ""
	lib := &mock.Interface{ExtensionsFunc: func() nvml.ExtendedInterface {
		return &mock.ExtendedInterface{LookupSymbolFunc: func(s string) error {
			if s == missing {
				return errors.New("undefined symbol")
			}
			return nil
		}}
	}}
	var asked []string
	dev := func(ret nvml.Return) nvml.Device {
		return &mock.Device{GetMemoryLimits_v1Func: func(ns string) (nvml.MemoryLimits_v1, nvml.Return) {
			asked = append(asked, ns)
			return nvml.MemoryLimits_v1{NameSpace: ns}, ret
		}}
	}
	devices := map[string]nvml.Device{
		"GPU-a": dev(nvml.ERROR_NOT_FOUND), "GPU-b": dev(nvml.SUCCESS), "GPU-mig": dev(nvml.SUCCESS),
		"GPU-no": dev(nvml.ERROR_NOT_SUPPORTED), "GPU-err": dev(nvml.ERROR_UNKNOWN),
	}
	mig := map[string]bool{"GPU-mig": true}

	got := Detect("615.27.01", lib, devices, mig, mount, nil)
	for uuid, want := range map[string]string{"GPU-a": "", "GPU-b": "", "GPU-mig": "MIG mode",
		"GPU-no": "does not partition this GPU's memory", "GPU-err": "/sys/fs/cgroup"} {
		s := got[uuid]
		if want == "" && !s.OK || want != "" && (s.OK || !strings.Contains(s.Reason, want)) {
			t.Errorf("%s: %+v, want %q", uuid, s, want)
		}
	}
	for _, ns := range asked {
		if ns != mount.Point {
			t.Errorf("the driver was asked about %q, want the hierarchy's root %q", ns, mount.Point)
		}
	}

	for name, tc := range map[string]struct {
		version, missing string
		mountErr         error
		want             string
	}{
		"an older driver":    {version: "580.159.04", want: "driver 580.159.04 is older than r615"},
		"an unreadable one":  {version: "", want: "is not <major>.<minor>"},
		"no Set in its NVML": {version: "615.00", missing: "nvmlDeviceSetMemoryLimits_v1", want: "has no nvmlDeviceSetMemoryLimits_v1"},
		"no cgroup v2":       {version: "620.10", mountErr: cgroup2.ErrNoMount, want: "no cgroup v2 hierarchy"},
	} {
		missing = tc.missing
		got := Detect(tc.version, lib, devices, mig, mount, tc.mountErr)
		if len(got) != len(devices) {
			t.Errorf("%s: %d GPUs answered, want %d", name, len(got), len(devices))
		}
		for uuid, s := range got {
			if s.OK || !strings.Contains(s.Reason, tc.want) {
				t.Errorf("%s: %s: %+v, want %q", name, uuid, s, tc.want)
			}
		}
	}
}
