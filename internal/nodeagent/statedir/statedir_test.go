package statedir

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func TestCreateServedGC(t *testing.T) {
	s := Dirs{Root: t.TempDir()}
	for _, u := range []types.UID{"live", "gone", "young"} {
		dir, err := s.Create(u, "c")
		if err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o777 || dir != filepath.Join(s.Root, string(u), "c") {
			t.Errorf("%s: %v %v", dir, fi, err)
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
