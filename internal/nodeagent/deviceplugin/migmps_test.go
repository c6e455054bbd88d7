package deviceplugin

import (
	"context"
	"errors"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// fakeMIG hands out MIG UUIDs and remembers what it was asked.
type fakeMIG struct{ asked []api.DeviceGrant }

func (f *fakeMIG) Prepare(_ context.Context, _ *v1.Pod, _ string, grants []api.DeviceGrant) ([]string, error) {
	var out []string
	for _, g := range grants {
		f.asked = append(f.asked, g)
		if g.MIG.Device != "" {
			out = append(out, g.MIG.Device)
		} else {
			out = append(out, "MIG-new-"+g.MIG.Profile)
		}
	}
	return out, nil
}

func migGrant(i int, profile, device string) api.DeviceGrant {
	return api.DeviceGrant{UUID: uuid(i), MemoryMiB: 4864, Cores: 12, MIG: &api.MIGGrant{Profile: profile, Device: device}}
}

// TestAllocateMIG: a MIG grant is answered with the MIG device's UUID and
// no limiter; without a MIG policy it is refused.
func TestAllocateMIG(t *testing.T) {
	e := newEnv(t, api.SharingMIG, 1)
	p := pod("m", spec{name: "main", grants: []api.DeviceGrant{migGrant(1, "1g.5gb", "MIG-abc")}})
	e.api.put(p)
	if _, err := e.admit(p); !errors.Is(err, ErrNoMatch) || !strings.Contains(err.Error(), "serves no MIG devices") {
		t.Fatalf("MIG grant without a MIG policy: %v", err)
	}
	e = newEnv(t, api.SharingMIGDynamic, 7)
	f := &fakeMIG{}
	e.plugin.SetPolicy(Policy{MIG: f})
	p = pod("d", spec{name: "main", grants: []api.DeviceGrant{migGrant(2, "3g.20gb", "")}})
	e.api.put(p)
	out, err := e.admit(p)
	if err != nil {
		t.Fatal(err)
	}
	if r := out["main"]; len(r.Envs) != 1 || r.Envs[api.EnvVisibleDevices] != "MIG-new-3g.20gb" || len(r.Mounts) != 0 {
		t.Errorf("dynamic MIG answer %v %v", r.Envs, r.Mounts)
	}
	if len(f.asked) != 1 || f.asked[0].UUID != uuid(2) {
		t.Errorf("asked %v", f.asked)
	}
	mixed := pod("x", spec{name: "main", grants: []api.DeviceGrant{migGrant(1, "1g.5gb", "MIG-a"), share(2, 100, 10)}})
	e.api.put(mixed)
	if _, err := e.admit(mixed); err == nil || !strings.Contains(err.Error(), "mixes MIG devices and GPU shares") {
		t.Errorf("mixed grants: %v", err)
	}
}

// TestWithdrawnPluginAllocatesNothing: a plugin offering no GPUs (its
// resource withdrawn; behind the kubelet shim it keeps serving) refuses
// Allocate before anything is prepared: no MIG instance is made for a
// resource the node no longer offers.
func TestWithdrawnPluginAllocatesNothing(t *testing.T) {
	e := newEnv(t, api.SharingMIGDynamic, 7)
	f := &fakeMIG{}
	e.plugin.SetPolicy(Policy{MIG: f})
	e.plugin.SetGPUs(nil, api.SharingMIGDynamic)
	p := pod("late", spec{name: "main", grants: []api.DeviceGrant{migGrant(2, "3g.20gb", "")}})
	e.api.put(p)
	e.kubelet.add(p)
	_, err := e.plugin.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{SlotID(uuid(2), 0)}}}})
	if !errors.Is(err, ErrNoMatch) || !strings.Contains(err.Error(), "is no longer offered") {
		t.Errorf("Allocate on a withdrawn plugin: %v", err)
	}
	if len(f.asked) != 0 {
		t.Errorf("a withdrawn plugin asked for MIG instances %v", f.asked)
	}
}

// TestAllocateMPS: an MPS client gets its GPU's pipe directory and its own
// thread and memory limits, the limiter's memory accounting and no SM
// pacing; two GPUs are refused; failRequestsGreaterThanOne refuses more
// than one device.
func TestAllocateMPS(t *testing.T) {
	e := newEnv(t, api.SharingMPS, 10)
	e.plugin.SetPolicy(Policy{MPS: &MPS{PipeDir: func(u string) string { return "/run/mps/" + u + "/pipe" }}})
	p := pod("a", spec{name: "main", grants: []api.DeviceGrant{share(1, 8192, 30)}})
	e.api.put(p)
	out, err := e.admit(p)
	if err != nil {
		t.Fatal(err)
	}
	r := out["main"]
	want := map[string]string{
		EnvMPSPipeDirectory: "/tessera/mps", EnvMPSThreadPercentage: "30", EnvMPSPinnedDeviceMemory: "0=8192M",
		"CUDA_DEVICE_MEMORY_LIMIT_0": "8192m",
	}
	for k, v := range want {
		if r.Envs[k] != v {
			t.Errorf("%s=%q, want %q (%v)", k, r.Envs[k], v, r.Envs)
		}
	}
	if _, ok := r.Envs[api.EnvSMLimit]; ok {
		t.Errorf("SM pacing under MPS: %v", r.Envs)
	}
	found := false
	for _, m := range r.Mounts {
		found = found || m.ContainerPath == "/tessera/mps" && m.HostPath == "/run/mps/"+uuid(1)+"/pipe"
	}
	if !found {
		t.Errorf("pipe directory not mounted: %v", r.Mounts)
	}
	two := pod("b", spec{name: "main", grants: []api.DeviceGrant{share(1, 100, 10), share(2, 100, 10)}})
	e.api.put(two)
	if _, err := e.admit(two); err == nil || !strings.Contains(err.Error(), "an MPS client connects to one GPU's control daemon") {
		t.Errorf("two MPS GPUs: %v", err)
	}
	e = newEnv(t, api.SharingTimeSlicing, 4)
	e.plugin.SetPolicy(Policy{FailRequestsGreaterThanOne: true})
	two = pod("c", spec{name: "main", grants: []api.DeviceGrant{share(1, 100, 10), share(2, 100, 10)}})
	e.api.put(two)
	if _, err := e.admit(two); err == nil || !strings.Contains(err.Error(), "failRequestsGreaterThanOne") {
		t.Errorf("failRequestsGreaterThanOne: %v", err)
	}
}

// TestMPSThreadPercentWithoutCores: a client that asked memory but no
// cores gets one replica's threads, not 1 % nor the whole GPU.
func TestMPSThreadPercentWithoutCores(t *testing.T) {
	e := newEnv(t, api.SharingMPS, 10)
	e.plugin.SetPolicy(Policy{MPS: &MPS{PipeDir: func(u string) string { return "/p/" + u }, SlotPercent: 10}})
	p := pod("nocores", spec{name: "main", grants: []api.DeviceGrant{share(1, 2048, 0)}})
	e.api.put(p)
	out, err := e.admit(p)
	if err != nil {
		t.Fatal(err)
	}
	if v := out["main"].Envs[EnvMPSThreadPercentage]; v != "10" {
		t.Errorf("%s=%s, want one replica's 10", EnvMPSThreadPercentage, v)
	}
}

// TestMPSCeilingHeld: a container with a memory ceiling on an MPS GPU is
// held to its guarantee (the limits file has no ceiling, the server's
// pinned-memory limit is the guarantee) and its pod is told so by a
// Warning event naming the ceiling, the GPU and the guarantee; a share
// without a ceiling gets no event.
func TestMPSCeilingHeld(t *testing.T) {
	e := newEnv(t, api.SharingMPS, 10)
	rec := record.NewFakeRecorder(10)
	e.plugin.opts.Recorder = rec
	e.plugin.SetPolicy(Policy{MPS: &MPS{PipeDir: func(u string) string { return "/run/mps/" + u + "/pipe" }}})
	g := share(1, 4096, 30)
	g.CeilingMiB = 6144
	p := pod("burst", spec{name: "main", grants: []api.DeviceGrant{g}})
	e.api.put(p)
	out, err := e.admit(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := out["main"].Envs[EnvMPSPinnedDeviceMemory]; got != "0=4096M" {
		t.Errorf("pinned-memory limit %q, want the guarantee 0=4096M", got)
	}
	var ev []string
	for len(rec.Events) > 0 {
		ev = append(ev, <-rec.Events)
	}
	want := "Warning " + ReasonCeilingHeld + " container main: its memory ceiling (6144 MiB) is not applied on GPU " + uuid(1) + ", which node " + node + " shares through MPS"
	if len(ev) != 1 || !strings.HasPrefix(ev[0], want) || !strings.Contains(ev[0], "set to the guarantee (4096 MiB)") {
		t.Errorf("events %q; want one starting %q", ev, want)
	}
	plain := pod("plain", spec{name: "main", grants: []api.DeviceGrant{share(1, 4096, 30)}})
	e.api.put(plain)
	if _, err := e.admit(plain); err != nil {
		t.Fatal(err)
	}
	if len(rec.Events) != 0 {
		t.Errorf("a share without a ceiling: event %q", <-rec.Events)
	}
}
