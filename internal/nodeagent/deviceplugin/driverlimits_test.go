package deviceplugin

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/tessera-gpu/tessera/internal/nodeagent/memlimits"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestDriverGrants: the driver holds a container's memory only where it
// partitions every shared GPU of the container (not MIG): soft = the
// guarantee, hard = the ceiling, or the guarantee when none is asked;
// exclusive GPUs have no memory limit to hold.
func TestDriverGrants(t *testing.T) {
	d := &DriverLimits{Partitions: func(uuid string) bool { return uuid != "GPU-old" }}
	grant := func(devs ...api.DeviceGrant) api.ContainerAllocation { return api.ContainerAllocation{Devices: devs} }
	for name, tc := range map[string]struct {
		c    api.ContainerAllocation
		want []memlimits.Grant
	}{
		"ceiling":    {grant(api.DeviceGrant{UUID: "GPU-a", MemoryMiB: 4096, CeilingMiB: 6144}), []memlimits.Grant{{UUID: "GPU-a", SoftMiB: 4096, HardMiB: 6144}}},
		"no ceiling": {grant(api.DeviceGrant{UUID: "GPU-a", MemoryMiB: 4096}), []memlimits.Grant{{UUID: "GPU-a", SoftMiB: 4096, HardMiB: 4096}}},
		"exclusive":  {grant(api.DeviceGrant{UUID: "GPU-a", MemoryMiB: 4096}, api.DeviceGrant{UUID: "GPU-b", Exclusive: true}), []memlimits.Grant{{UUID: "GPU-a", SoftMiB: 4096, HardMiB: 4096}}},
		"old driver": {grant(api.DeviceGrant{UUID: "GPU-a", MemoryMiB: 4096}, api.DeviceGrant{UUID: "GPU-old", MemoryMiB: 4096}), nil},
		"MIG":        {grant(api.DeviceGrant{UUID: "GPU-a", MemoryMiB: 4864, MIG: &api.MIGGrant{Profile: "1g.5gb"}}), nil},
		"only cores": {grant(api.DeviceGrant{UUID: "GPU-a", Cores: 30}), nil},
	} {
		if got := d.driverGrants(tc.c); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %+v, want %+v", name, got, tc.want)
		}
	}
	if got := (*DriverLimits)(nil).driverGrants(grant(api.DeviceGrant{UUID: "GPU-a", MemoryMiB: 1})); got != nil {
		t.Errorf("no driver limits: %+v", got)
	}
}

// TestDriverLimitsSpec: the container's CDI spec, as the CDI library
// reads and injects it, runs the hook at createContainer with the grants
// and at poststop to release them; its file name maps back to the
// container, and it goes with RemoveSpec.
func TestDriverLimitsSpec(t *testing.T) {
	d := &DriverLimits{Hook: []string{"/usr/local/tessera/tessera", "memory-limits"}, CDIDir: t.TempDir(), Partitions: func(string) bool { return true }}
	grants := []memlimits.Grant{{UUID: "GPU-a", SoftMiB: 4096, HardMiB: 6144}}
	dev, err := d.writeSpec("0f3a6c2e-5b1d", "main", "/var/lib/tessera/containers/x/main/driver-memory", grants)
	if err != nil {
		t.Fatal(err)
	}
	if dev != api.CDIKindMemoryLimits+"=0f3a6c2e-5b1d_main" {
		t.Errorf("device %q", dev)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(d.CDIDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if _, err := cache.InjectDevices(spec, dev); err != nil {
		t.Fatal(err)
	}
	if spec.Hooks == nil || len(spec.Hooks.CreateContainer) != 1 || len(spec.Hooks.Poststop) != 1 {
		t.Fatalf("hooks %+v", spec.Hooks)
	}
	create, stop := spec.Hooks.CreateContainer[0], spec.Hooks.Poststop[0]
	if create.Path != d.Hook[0] || strings.Join(create.Args, " ") != "tessera memory-limits --confirm /var/lib/tessera/containers/x/main/driver-memory --gpu GPU-a=4096:6144" {
		t.Errorf("createContainer hook %+v", create)
	}
	if strings.Join(stop.Args, " ") != "tessera memory-limits --release --confirm /var/lib/tessera/containers/x/main/driver-memory" {
		t.Errorf("poststop hook %+v", stop)
	}
	files, _ := filepath.Glob(filepath.Join(d.CDIDir, "*.json"))
	if len(files) != 1 {
		t.Fatalf("spec files %v", files)
	}
	uid, c, ok := d.SpecOf(filepath.Base(files[0]))
	if !ok || uid != "0f3a6c2e-5b1d" || c != "main" {
		t.Errorf("SpecOf(%s) = %q %q %v", filepath.Base(files[0]), uid, c, ok)
	}
	if _, _, ok := d.SpecOf("nvidia.com-gpu.json"); ok {
		t.Error("another vendor's spec taken for a container's")
	}
	if err := d.RemoveSpec("0f3a6c2e-5b1d", "main"); err != nil {
		t.Fatal(err)
	}
	if files, _ := filepath.Glob(filepath.Join(d.CDIDir, "*.json")); len(files) != 0 {
		t.Errorf("left %v", files)
	}
}
