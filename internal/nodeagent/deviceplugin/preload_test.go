package deviceplugin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/internal/limiterconf"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestDeclaredPreloadsKept: the agent's read-only preload list replaces
// the image's /etc/ld.so.preload, which silently dropped an image's
// jemalloc; a pod that declares its preloads gets a list of its own, the
// limiter first, then its libraries. Pods that declare none keep the
// node's shared list; a declaration that became invalid after admission
// is refused before anything is served.
func TestDeclaredPreloadsKept(t *testing.T) {
	e := newEnv(t, api.SharingShared, 10)
	if err := e.paths.WritePreload(); err != nil {
		t.Fatal(err)
	}
	jemalloc := "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
	p := pod("jem", spec{name: "main", grants: []api.DeviceGrant{share(0, 4096, 20)}})
	p.Annotations[api.AnnotationPreload] = jemalloc
	e.api.put(p)
	out, err := e.admit(p)
	if err != nil {
		t.Fatal(err)
	}
	own := filepath.Join(e.paths.StateRoot, "uid-jem", "main", "ld.so.preload")
	var mount string
	for _, m := range out["main"].Mounts {
		if m.ContainerPath == api.ContainerPreload {
			if !m.ReadOnly {
				t.Error("the preload list is mounted writable")
			}
			mount = m.HostPath
		}
	}
	if mount != own {
		t.Fatalf("preload list mounted from %q, want the container's own %q", mount, own)
	}
	b, err := os.ReadFile(own)
	if err != nil || string(b) != e.paths.LimiterContainer+"\n"+jemalloc+"\n" {
		t.Errorf("own preload list %q %v", b, err)
	}
	if fi, err := os.Stat(own); err != nil || fi.Mode().Perm() != 0o444 {
		t.Errorf("own preload list mode %v %v", fi, err)
	}

	// No declaration: the node's shared list, naming the limiter only.
	q := pod("plain", spec{name: "main", grants: []api.DeviceGrant{share(1, 4096, 20)}})
	e.api.put(q)
	out, err = e.admit(q)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range out["main"].Mounts {
		if m.ContainerPath == api.ContainerPreload && m.HostPath != e.paths.PreloadHost {
			t.Errorf("undeclared pod's preload from %q", m.HostPath)
		}
	}
	if b, _ := os.ReadFile(e.paths.PreloadHost); string(b) != e.paths.LimiterContainer+"\n" {
		t.Errorf("shared preload list %q", b)
	}

	// Changed after admission to a path the container could write.
	bad := pod("bad", spec{name: "main", grants: []api.DeviceGrant{share(2, 4096, 20)}})
	bad.Annotations[api.AnnotationPreload] = "/tmp/libevil.so"
	e.api.put(bad)
	if _, err := e.admit(bad); err == nil || !strings.Contains(err.Error(), api.AnnotationPreload) || !strings.Contains(err.Error(), "/tmp/libevil.so") {
		t.Errorf("invalid declaration: %v", err)
	}
	if e.plugin.opts.Matcher.State.Served("uid-bad", "main") {
		t.Error("a refused container was marked served")
	}
}

// TestSpecEnvironmentChangesNoShare: the variables the webhook now
// admits (the limiter's own among them) play no part in what the agent
// serves: the limits file, mounted read-only, carries the record's
// share, whatever the pod's spec sets; the limiter takes its limits from
// that file over any variable (limiter/test: file-over-env).
func TestSpecEnvironmentChangesNoShare(t *testing.T) {
	e := newEnv(t, api.SharingShared, 10)
	p := pod("env", spec{name: "main", grants: []api.DeviceGrant{share(0, 4096, 25)}})
	p.Spec.Containers[0].Env = []v1.EnvVar{
		{Name: "CUDA_DEVICE_MEMORY_LIMIT_0", Value: "0"}, {Name: "CUDA_DEVICE_SM_LIMIT", Value: "100"},
		{Name: "CUDA_DEVICE_MEMORY_SHARED_CACHE", Value: "/tmp/mine"}, {Name: "TESSERA_SM_ELASTIC", Value: "1"},
		{Name: "LD_PRELOAD", Value: "/usr/lib/libtcmalloc.so.4"}, {Name: "CUDA_DEVICE_ORDER", Value: "PCI_BUS_ID"},
	}
	e.api.put(p)
	out, err := e.admit(p)
	if err != nil {
		t.Fatal(err)
	}
	var limits string
	for _, m := range out["main"].Mounts {
		if m.ContainerPath == limiterconf.Path {
			if !m.ReadOnly {
				t.Error("limits file mounted writable")
			}
			limits = m.HostPath
		}
	}
	b, err := os.ReadFile(limits)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := limiterconf.Parse(b)
	if err != nil || len(cfg.Devices) != 1 || cfg.Devices[0].UUID != uuid(0) || cfg.Devices[0].MemoryMiB != 4096 || cfg.Devices[0].SMPercent != 25 || cfg.Elastic || cfg.StatePath != "/tessera/state/cache" {
		t.Errorf("limits file %+v %v", cfg, err)
	}
}
