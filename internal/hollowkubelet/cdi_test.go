package hollowkubelet

import (
	"path/filepath"
	"strings"
	"testing"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

func TestResolveCDI(t *testing.T) {
	dir := t.TempDir()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &cdispec.Spec{Version: cdispec.CurrentVersion, Kind: "gpu.tessera.io/claim", Devices: []cdispec.Device{{
		Name: "uid-gpu",
		ContainerEdits: cdispec.ContainerEdits{
			Env:    []string{"NVIDIA_VISIBLE_DEVICES=GPU-1"},
			Mounts: []*cdispec.Mount{{HostPath: filepath.Join(dir, "limiter.conf"), ContainerPath: "/etc/tessera/limiter.conf", Options: []string{"ro", "bind"}}, {HostPath: dir, ContainerPath: "/tessera/state", Options: []string{"rw", "bind"}}},
		},
	}}}
	if err := cache.WriteSpec(spec, "gpu.tessera.io-claim_uid.json"); err != nil {
		t.Fatal(err)
	}
	got, err := ResolveCDI([]string{dir}, []string{"gpu.tessera.io/claim=uid-gpu"})
	if err != nil {
		t.Fatal(err)
	}
	ro := map[string]bool{}
	for _, m := range got.Mounts {
		ro[m.ContainerPath] = m.ReadOnly
	}
	if got.Env["NVIDIA_VISIBLE_DEVICES"] != "GPU-1" || len(got.Mounts) != 2 || !ro["/etc/tessera/limiter.conf"] || ro["/tessera/state"] {
		t.Errorf("edits %+v", got)
	}
	if _, err := ResolveCDI([]string{dir}, []string{"gpu.tessera.io/claim=gone"}); err == nil || !strings.Contains(err.Error(), "gpu.tessera.io/claim=gone") {
		t.Errorf("unknown device: %v", err)
	}
}
