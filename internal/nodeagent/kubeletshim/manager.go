package kubeletshim

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"
)

// The node agent serves one device plugin per resource it offers (the GPU
// resource, its shared rename, MIG profiles), each on a socket of its own
// in one directory; the set changes with the node's configuration. The
// Manager runs one Shim per resource whose socket has appeared there, and
// keeps it: a socket that goes away is an agent restarting (its Shim waits
// for it and reports the devices unhealthy after StaleAfter). A resource
// no longer offered keeps its socket, serving an empty list, also across
// agent restarts (the agent records what it served in the directory).

// AgentSocketName is the file name of the agent's socket for a resource
// in the agent's socket directory: the resource with its first "/" as "_"
// (a resource's domain holds no "_"), and ".sock".
func AgentSocketName(resource string) string {
	return strings.Replace(resource, "/", "_", 1) + ".sock"
}

// ResourceOfSocket is the resource of an agent socket's file name.
func ResourceOfSocket(name string) (string, bool) {
	base, ok := strings.CutSuffix(name, ".sock")
	if !ok {
		return "", false
	}
	domain, rest, ok := strings.Cut(base, "_")
	if !ok || domain == "" || rest == "" {
		return "", false
	}
	return domain + "/" + rest, true
}

// EndpointName is the shim's socket name in the kubelet's directory for a
// resource: short, so the path stays within a unix socket's 107 bytes.
func EndpointName(resource string) string {
	_, name, _ := strings.Cut(resource, "/")
	return "tessera-shim-" + strings.NewReplacer(".", "-", "+", "-", "_", "-").Replace(name) + ".sock"
}

// ManagerOptions configure a Manager; the Shim fields apply to every
// resource's Shim.
type ManagerOptions struct {
	// PluginDir is the kubelet's device-plugin directory.
	PluginDir string
	// AgentSocketDir is where the agent serves its plugins.
	AgentSocketDir string
	AgentWait      time.Duration
	StaleAfter     time.Duration
	CheckInterval  time.Duration
}

// Manager runs a Shim per resource the agent serves.
type Manager struct {
	opts   ManagerOptions
	logger klog.Logger

	mu    sync.Mutex
	shims map[string]*Shim
}

// NewManager returns a manager; Run serves.
func NewManager(opts ManagerOptions, logger klog.Logger) *Manager {
	if opts.CheckInterval <= 0 {
		opts.CheckInterval = time.Second
	}
	return &Manager{opts: opts, logger: logger, shims: map[string]*Shim{}}
}

// Shim returns the shim of a resource (nil before its socket appeared).
func (m *Manager) Shim(resource string) *Shim {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.shims[resource]
}

// Run watches the agent's socket directory and serves until ctx ends.
func (m *Manager) Run(ctx context.Context) error {
	if err := os.MkdirAll(m.opts.AgentSocketDir, 0o755); err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	scan := func() {
		entries, err := os.ReadDir(m.opts.AgentSocketDir)
		if err != nil {
			m.logger.Error(err, "Reading the agent's socket directory", "dir", m.opts.AgentSocketDir)
			return
		}
		for _, e := range entries {
			res, ok := ResourceOfSocket(e.Name())
			if !ok || e.Type()&os.ModeSocket == 0 {
				continue
			}
			m.mu.Lock()
			_, running := m.shims[res]
			m.mu.Unlock()
			if running {
				continue
			}
			s, err := New(Options{
				Resource: res, PluginDir: m.opts.PluginDir, Endpoint: EndpointName(res),
				AgentSocket: filepath.Join(m.opts.AgentSocketDir, e.Name()),
				AgentWait:   m.opts.AgentWait, StaleAfter: m.opts.StaleAfter, CheckInterval: m.opts.CheckInterval,
			}, m.logger.WithValues("resource", res))
			if err != nil {
				m.logger.Error(err, "Starting the shim of a resource", "resource", res)
				continue
			}
			m.mu.Lock()
			m.shims[res] = s
			m.mu.Unlock()
			m.logger.Info("Serving a resource for the kubelet", "resource", res)
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = s.Run(ctx)
			}()
		}
	}
	w, err := fsnotify.NewWatcher()
	if err == nil {
		if err = w.Add(m.opts.AgentSocketDir); err != nil {
			w.Close()
		}
	}
	var events <-chan fsnotify.Event
	if err != nil {
		m.logger.Error(err, "Cannot watch the agent's socket directory; scanning it every interval", "dir", m.opts.AgentSocketDir)
	} else {
		defer w.Close()
		events = w.Events
	}
	t := time.NewTicker(m.opts.CheckInterval)
	defer t.Stop()
	for {
		scan()
		select {
		case <-ctx.Done():
			return nil
		case <-events:
		case <-t.C:
		}
	}
}
