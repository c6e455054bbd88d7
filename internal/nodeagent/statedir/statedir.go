// Package statedir keeps the node agent's per-container directories,
// <root>/<pod UID>/<container>. The device plugin creates a container's
// directory when it answers the kubelet's Allocate; the directory's
// existence is the agent's record that the container was served, which
// survives agent restarts, so nothing is served twice. The agent removes
// the directories of pods that are gone (Dirs.GC).
//
// Layout of one container's directory (root's, mode 0755; never mounted
// into the container as a whole):
//
//	state/        the limiter's shared state, writable by every user of the
//	              container (mode 1777), mounted at api.ContainerStateDir;
//	              also the need file (NeedFile), where the limiter asks the
//	              agent to reclaim memory borrowed past other guarantees
//	limiter.conf  the limits file, mounted read-only at limiterconf.Path
//	ld.so.preload the container's own preload list, when its pod declares
//	              preloads (api.AnnotationPreload), mounted read-only at
//	              api.ContainerPreload in place of the node's shared one
//	grant.json    what the container was served: the agent's ledger of
//	              the node's GPUs, out of the container's reach
//	driver-memory where the driver holds the container's GPU memory
//	              limits: their confirmation, written by the memory-limits
//	              hook (memlimits), mounted read-only at
//	              memlimits.ConfirmPath; empty until confirmed
//
// A directory written by an agent before this layout (mode 0777, mounted
// whole, holding the limiter's "cache" file) is a legacy directory: the
// container could write anything into it, so nothing in it is read.
package statedir

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/internal/atomicfile"
	"github.com/tessera-gpu/tessera/internal/limiterconf"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Names inside a container's directory.
const (
	stateName   = "state"
	limitsName  = "limiter.conf"
	preloadName = "ld.so.preload"
	grantName   = "grant.json"
	confirmName = "driver-memory"
)

// LimiterStateFile is the name of the limiter's shared-state file
// (internal/limiterstate) in a container's directory.
const LimiterStateFile = "cache"

// NeedFile is the name of the need file in a container's state
// directory: the limiter writes it when the driver refuses an allocation
// within the container's guarantee (the limits file's reclaim=), and the
// host-side reconciler reads it (reconcile.ParseNeed). The container may
// write anything there: it only asks.
const NeedFile = "need"

// Dirs are the per-container directories under Root.
type Dirs struct{ Root string }

// Path is the directory of one container.
func (s Dirs) Path(uid types.UID, container string) string {
	return filepath.Join(s.Root, string(uid), container)
}

// StateDir is the container's writable limiter state directory.
func (s Dirs) StateDir(uid types.UID, container string) string {
	return filepath.Join(s.Path(uid, container), stateName)
}

// LimitsFile is the container's limits file on the host.
func (s Dirs) LimitsFile(uid types.UID, container string) string {
	return filepath.Join(s.Path(uid, container), limitsName)
}

// ConfirmFile is the container's confirmation of driver-held memory
// limits on the host.
func (s Dirs) ConfirmFile(uid types.UID, container string) string {
	return filepath.Join(s.Path(uid, container), confirmName)
}

// CreateConfirm creates the container's confirmation file empty (nothing
// confirmed; read-only for all but root, which the hook runs as).
func (s Dirs) CreateConfirm(uid types.UID, container string) (string, error) {
	p := s.ConfirmFile(uid, container)
	return p, os.WriteFile(p, nil, 0o444)
}

// PreloadFile is the container's own preload list on the host.
func (s Dirs) PreloadFile(uid types.UID, container string) string {
	return filepath.Join(s.Path(uid, container), preloadName)
}

// WritePreload writes the container's own preload list (read-only for
// all).
func (s Dirs) WritePreload(uid types.UID, container string, b []byte) error {
	return atomicfile.Write(s.PreloadFile(uid, container), b, 0o444)
}

// Borrower is the container's name in the GPU budget files (the
// limiter's borrower=): opaque to the other tenants who read them.
func Borrower(uid types.UID, container string) string {
	return limiterconf.BorrowerName(string(uid) + "/" + container)
}

// Served reports whether the container was answered before.
func (s Dirs) Served(uid types.UID, container string) bool {
	_, err := os.Stat(s.Path(uid, container))
	return err == nil
}

// Create makes the container's directory and its state directory and
// returns the container's directory.
func (s Dirs) Create(uid types.UID, container string) (string, error) {
	dir := s.Path(uid, container)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating the container state directory: %w", err)
	}
	state := filepath.Join(dir, stateName)
	if err := os.Mkdir(state, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("creating the container state directory: %w", err)
	}
	// The container's processes may run as any user and share the
	// limiter's file: world-writable, sticky.
	if err := os.Chmod(state, 0o777|os.ModeSticky); err != nil {
		return "", fmt.Errorf("creating the container state directory: %w", err)
	}
	return dir, nil
}

// WriteLimits writes the container's limits file (read-only for all).
func (s Dirs) WriteLimits(uid types.UID, container string, b []byte) error {
	return atomicfile.Write(s.LimitsFile(uid, container), b, 0o444)
}

// Grant is what one container was served: the devices of its allocation
// record, as the agent checked them.
type Grant struct {
	PodUID    types.UID         `json:"podUID"`
	Namespace string            `json:"namespace"`
	Pod       string            `json:"pod"`
	Container string            `json:"container"`
	Init      bool              `json:"init,omitempty"`
	Devices   []api.DeviceGrant `json:"devices"`
	Served    time.Time         `json:"served"`
}

// WriteGrant records what the container was served.
func (s Dirs) WriteGrant(g Grant) error {
	b, err := json.Marshal(g)
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(s.Path(g.PodUID, g.Container), grantName), b, 0o644)
}

// Entry is one served container found on disk.
type Entry struct {
	PodUID    types.UID
	Container string
	// Grant is what it was served; nil for a legacy directory (see the
	// package documentation) or a grant that cannot be read.
	Grant *Grant
}

// Entries lists every served container.
func (s Dirs) Entries() ([]Entry, error) {
	pods, err := os.ReadDir(s.Root)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, p := range pods {
		if !p.IsDir() {
			continue
		}
		cs, err := os.ReadDir(filepath.Join(s.Root, p.Name()))
		if err != nil {
			continue // removed meanwhile
		}
		for _, c := range cs {
			if !c.IsDir() {
				continue
			}
			e := Entry{PodUID: types.UID(p.Name()), Container: c.Name()}
			e.Grant = s.readGrant(e.PodUID, e.Container)
			out = append(out, e)
		}
	}
	return out, nil
}

func (s Dirs) readGrant(uid types.UID, container string) *Grant {
	dir := s.Path(uid, container)
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm()&0o002 != 0 {
		return nil // legacy: writable by the container
	}
	b, err := os.ReadFile(filepath.Join(dir, grantName))
	if err != nil {
		return nil
	}
	var g Grant
	if json.Unmarshal(b, &g) != nil || g.PodUID != uid || g.Container != container {
		return nil
	}
	return &g
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
