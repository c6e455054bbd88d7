package kubeletshim

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/internal/testenv/poll"
)

func TestSocketNames(t *testing.T) {
	for _, res := range []string{"nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.5gb", "example.org/mig-3g.20gb+me"} {
		name := AgentSocketName(res)
		got, ok := ResourceOfSocket(name)
		if !ok || got != res {
			t.Errorf("%s: socket %q reads back as %q, %v", res, name, got, ok)
		}
		if ep := EndpointName(res); len(ep) > 40 || filepath.Base(ep) != ep {
			t.Errorf("%s: endpoint %q", res, ep)
		}
	}
	for _, name := range []string{"kubelet.sock", "nvidia.com_gpu", "_gpu.sock", "nvidia.com_.sock"} {
		if r, ok := ResourceOfSocket(name); ok {
			t.Errorf("%q read as resource %q", name, r)
		}
	}
}

// TestManagerServesEachResource: every agent socket that appears in the
// directory gets a shim of its own, registered with the kubelet for its
// resource, at once (inotify; the periodic scan is an hour away).
func TestManagerServesEachResource(t *testing.T) {
	pluginDir, agentDir := t.TempDir(), t.TempDir()
	kubelet := startKubelet(t, pluginDir)
	m := NewManager(ManagerOptions{PluginDir: pluginDir, AgentSocketDir: agentDir, AgentWait: 5 * time.Second, CheckInterval: time.Hour},
		ktesting.NewLogger(t, ktesting.NewConfig()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(ctx) }()
	defer func() { cancel(); <-done }()
	want := []string{"nvidia.com/gpu", "nvidia.com/mig-1g.5gb"}
	// One at a time: the second socket appears after the manager's first
	// scan, so only the directory watch can find it.
	for i, res := range want {
		srv := startAgent(t, filepath.Join(agentDir, AgentSocketName(res)))
		defer srv.Stop()
		poll.Until(t, res+" registered", 10*time.Second, func() bool { return kubelet.count() == i+1 })
	}
	var got []string
	kubelet.mu.Lock()
	for _, r := range kubelet.regs {
		got = append(got, r.ResourceName)
		if r.Endpoint != EndpointName(r.ResourceName) {
			t.Errorf("%s registered with endpoint %q", r.ResourceName, r.Endpoint)
		}
	}
	kubelet.mu.Unlock()
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("registered %v, want %v", got, want)
	}
	for _, res := range want {
		if m.Shim(res) == nil {
			t.Errorf("no shim for %s", res)
		}
	}
}
