package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apimachineryversion "k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
	"github.com/tessera-gpu/tessera/internal/preflight"
)

// apiServer serves /version as gitVersion and records the events posted
// to it.
type apiServer struct {
	mu     sync.Mutex
	events []corev1.Event
}

func (a *apiServer) start(t *testing.T, gitVersion string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/version":
			_ = json.NewEncoder(w).Encode(apimachineryversion.Info{GitVersion: gitVersion})
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/events"):
			b, _ := io.ReadAll(r.Body)
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(b, nil, nil)
			e, ok := obj.(*corev1.Event)
			if err != nil || !ok {
				http.Error(w, fmt.Sprintf("%v %T", err, obj), http.StatusBadRequest)
				return
			}
			a.mu.Lock()
			a.events = append(a.events, *e)
			a.mu.Unlock()
			e.APIVersion, e.Kind = "v1", "Event"
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(e)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: " + srv.URL + "}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\nusers:\n- name: u\n  user: {}\ncurrent-context: c\n"
	if err := os.WriteFile(kc, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return kc
}

// TestSchedulerRefusesOldAPIServer: `tessera scheduler` asks the API
// server of its configuration its version before kube-scheduler starts,
// stops on one older than the kube-scheduler it links, and writes a
// Warning event on its Pod.
func TestSchedulerRefusesOldAPIServer(t *testing.T) {
	t.Setenv("POD_NAME", "tessera-scheduler-abc")
	t.Setenv("POD_NAMESPACE", "tessera-system")
	var srv apiServer
	kc := srv.start(t, "v1.35.2")
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nclientConnection:\n  kubeconfig: "+kc+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--kubeconfig", kc}, {"--config=" + cfg}} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append([]string{"scheduler"}, args...), &out, &errOut)
		if code != 1 || !strings.Contains(errOut.String(), "the API server is Kubernetes v1.35.2; this Tessera needs 1.36 or later") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut.String())
		}
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if len(srv.events) != 2 {
		t.Fatalf("%d events, want one per run", len(srv.events))
	}
	e := srv.events[0]
	if e.Reason != preflight.Reason || e.Type != corev1.EventTypeWarning || e.InvolvedObject.Kind != "Pod" ||
		e.InvolvedObject.Name != "tessera-scheduler-abc" || e.Namespace != "tessera-system" || !strings.Contains(e.Message, "v1.35.2") {
		t.Errorf("event %+v", e)
	}
}

func TestNodeAgentMissingDriverRoot(t *testing.T) {
	root := filepath.Join(t.TempDir(), "driver")
	for _, setup := range []func(){func() {}, func() { _ = os.MkdirAll(filepath.Join(root, "usr/lib64"), 0o755) }} {
		setup()
		var out, errOut bytes.Buffer
		code := run(context.Background(), []string{"node-agent", "--discover-only", "--driver-root", root}, &out, &errOut)
		if code != 1 || !strings.Contains(errOut.String(), root) || !strings.Contains(errOut.String(), "NVIDIA driver") {
			t.Errorf("exit %d, stderr %q", code, errOut.String())
		}
	}
}

func TestInstallLimiter(t *testing.T) {
	dir := t.TempDir()
	from := filepath.Join(dir, "lib-new.so")
	if err := os.WriteFile(from, []byte("new library"), 0o600); err != nil {
		t.Fatal(err)
	}
	host := filepath.Join(dir, "host")
	if err := os.Mkdir(host, 0o755); err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(host, "libtessera-limiter.so")
	if err := os.WriteFile(to, []byte("old library"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A running container has the old library open (mapped).
	old, err := os.Open(to)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"install-limiter", "--from", from, "--to", to}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if b, _ := os.ReadFile(to); string(b) != "new library" {
		t.Errorf("installed %q", b)
	}
	if fi, _ := os.Stat(to); fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v", fi.Mode())
	}
	if b, _ := io.ReadAll(old); string(b) != "old library" {
		t.Errorf("the running container's library changed under it: %q", b)
	}
	if entries, _ := os.ReadDir(host); len(entries) != 1 {
		t.Errorf("left behind: %v", entries)
	}
	errOut.Reset()
	if code := run(context.Background(), []string{"install-limiter", "--from", from, "--to", filepath.Join(dir, "missing", "lib.so")}, &out, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), filepath.Join(dir, "missing")+" does not exist") {
		t.Errorf("missing directory: exit %d, %s", code, errOut.String())
	}
	if code := run(context.Background(), []string{"install-limiter"}, &out, &errOut); code != 2 {
		t.Errorf("no --to: exit %d", code)
	}
}

func shortTempDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "pf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// TestAgentChecks: the node agent's checks with a DGX H100's NVML: a
// missing CDI spec stops it with an event on its Node, a spec naming every
// GPU lets it start, another device plugin is an event it goes on with.
func TestAgentChecks(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")}}}
	client := fake.NewClientset(node)
	client.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &apimachineryversion.Info{GitVersion: "v1.36.1"}
	pluginDir := shortTempDir(t)
	l, err := net.Listen("unix", filepath.Join(pluginDir, "nvidia-gpu.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cdiDir := t.TempDir()
	lib := nvmltest.DGXH100()
	c := agentChecks{strategy: deviceplugin.DeviceListCDI, cdiDirs: []string{cdiDir}, pluginDir: pluginDir,
		shimSocket: "tessera-shim-gpu.sock", resource: "nvidia.com/gpu", open: func() (nvml.Interface, error) { return lib, nil }}
	ctx := context.Background()
	events := func() []string {
		evs, err := client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range evs.Items {
			if e.InvolvedObject.Name != "gpu-1" || e.Reason != preflight.Reason {
				t.Errorf("event %+v", e)
			}
			out = append(out, e.Message)
		}
		return out
	}
	if _, err := c.run(ctx, client, "gpu-1"); err == nil || !strings.Contains(err.Error(), "no CDI spec") {
		t.Fatalf("no CDI spec: %v", err)
	}
	if ev := events(); len(ev) != 1 || !strings.Contains(ev[0], "no CDI spec") {
		t.Fatalf("events %q", ev)
	}
	uuids, err := gpuUUIDs(lib)
	if err != nil || len(uuids) != 8 {
		t.Fatalf("%v %v", uuids, err)
	}
	spec := "cdiVersion: \"0.5.0\"\nkind: nvidia.com/gpu\ndevices:\n"
	for _, u := range uuids {
		spec += "- name: " + u + "\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n"
	}
	if err := os.WriteFile(filepath.Join(cdiDir, "nvidia.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := c.run(ctx, client, "gpu-1"); err != nil || got != lib {
		t.Fatalf("with a spec: %v", err)
	}
	if ev := events(); len(ev) != 2 || !strings.Contains(ev[1], "another device plugin serves nvidia.com/gpu") || !strings.Contains(ev[1], "nvidia-gpu.sock") {
		t.Fatalf("events %q", ev)
	}
	// An API server older than supported stops the agent first.
	client.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &apimachineryversion.Info{GitVersion: "v1.34.0"}
	if _, err := c.run(ctx, client, "gpu-1"); err == nil || !strings.Contains(err.Error(), "v1.34.0") {
		t.Errorf("old API server: %v", err)
	}
}
