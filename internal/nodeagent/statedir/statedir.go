// Package statedir keeps the node agent's per-container state
// directories, <root>/<pod UID>/<container>. The device plugin creates a
// container's directory when it answers the kubelet's Allocate and mounts
// it into the container, where the limiter keeps its shared-state file;
// the directory's existence is also the agent's record that the container
// was served, which survives agent restarts, so nothing is served twice.
// The agent removes the directories of pods that are gone (Dirs.GC).
package statedir

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// LimiterStateFile is the name of the limiter's shared-state file
// (internal/limiterstate) in a container's directory.
const LimiterStateFile = "cache"

// Dirs are the per-container directories under Root.
type Dirs struct{ Root string }

// Path is the directory of one container.
func (s Dirs) Path(uid types.UID, container string) string {
	return filepath.Join(s.Root, string(uid), container)
}

// Served reports whether the container was answered before.
func (s Dirs) Served(uid types.UID, container string) bool {
	_, err := os.Stat(s.Path(uid, container))
	return err == nil
}

// Create makes the container's directory (mode 0777: the container's
// processes, of any user, share the limiter's file in it) and returns its
// path.
func (s Dirs) Create(uid types.UID, container string) (string, error) {
	dir := s.Path(uid, container)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating the container state directory: %w", err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		return "", fmt.Errorf("creating the container state directory: %w", err)
	}
	return dir, nil
}

// GC removes the directories of pods for which live returns false, when
// they are older than minAge (so a pod the caller's cache does not know
// yet keeps its directory). It returns the pod UIDs removed.
func (s Dirs) GC(live func(types.UID) bool, minAge time.Duration, now time.Time) ([]types.UID, error) {
	entries, err := os.ReadDir(s.Root)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []types.UID
	for _, e := range entries {
		uid := types.UID(e.Name())
		if !e.IsDir() || live(uid) {
			continue
		}
		info, err := e.Info()
		if err != nil || now.Sub(info.ModTime()) < minAge {
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.Root, e.Name())); err != nil {
			return removed, err
		}
		removed = append(removed, uid)
	}
	return removed, nil
}
