package statedir

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/pkg/api"
)

func TestCreateServedGC(t *testing.T) {
	s := Dirs{Root: t.TempDir()}
	for _, u := range []types.UID{"live", "gone", "young"} {
		dir, err := s.Create(u, "c")
		if err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o755 || dir != filepath.Join(s.Root, string(u), "c") {
			t.Errorf("%s: %v %v", dir, fi, err)
		}
		if fi, err := os.Stat(s.StateDir(u, "c")); err != nil || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
			t.Errorf("state dir of %s: %v %v", u, fi, err)
		}
	}
	old := time.Now().Add(-time.Hour)
	for _, u := range []string{"live", "gone"} {
		if err := os.Chtimes(filepath.Join(s.Root, u), old, old); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := s.GC(func(u types.UID) bool { return u == "live" }, time.Minute, time.Now())
	if err != nil || len(removed) != 1 || removed[0] != "gone" {
		t.Errorf("removed %v %v", removed, err)
	}
	if !s.Served("live", "c") || !s.Served("young", "c") || s.Served("gone", "c") {
		t.Error("wrong directories removed")
	}
	if removed, err := (Dirs{Root: filepath.Join(s.Root, "absent")}).GC(func(types.UID) bool { return false }, 0, time.Now()); err != nil || removed != nil {
		t.Errorf("no root yet: %v %v", removed, err)
	}
}

// TestGrants: what a container was served is read back, and nothing is
// read from a directory the container could write (the layout before the
// limits file).
func TestGrants(t *testing.T) {
	s := Dirs{Root: t.TempDir()}
	if _, err := s.Create("p1", "c"); err != nil {
		t.Fatal(err)
	}
	g := Grant{PodUID: "p1", Namespace: "ns", Pod: "p", Container: "c", Devices: []api.DeviceGrant{{UUID: "GPU-1", MemoryMiB: 100, Cores: 10}}}
	if err := s.WriteGrant(g); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteLimits("p1", "c", []byte("version=1\n")); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(s.LimitsFile("p1", "c")); err != nil || fi.Mode().Perm() != 0o444 {
		t.Errorf("limits file: %v %v", fi, err)
	}
	// A legacy directory, writable by its container, with a forged grant.
	legacy := s.Path("p2", "c")
	if err := os.MkdirAll(legacy, 0o777); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(legacy, 0o777)
	forged, _ := json.Marshal(Grant{PodUID: "p2", Container: "c", Devices: []api.DeviceGrant{{UUID: "GPU-1", MemoryMiB: 1}}})
	_ = os.WriteFile(filepath.Join(legacy, "grant.json"), forged, 0o644)
	es, err := s.Entries()
	if err != nil || len(es) != 2 {
		t.Fatalf("%+v %v", es, err)
	}
	for _, e := range es {
		switch e.PodUID {
		case "p1":
			if e.Grant == nil || e.Grant.Devices[0].MemoryMiB != 100 {
				t.Errorf("p1: %+v", e.Grant)
			}
		case "p2":
			if e.Grant != nil {
				t.Errorf("a grant read from a container-writable directory: %+v", e.Grant)
			}
		}
	}
}
