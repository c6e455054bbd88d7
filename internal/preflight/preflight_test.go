package preflight

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	apimachineryversion "k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
)

// servedVersion is a client of an HTTP server that serves /version as an
// API server does.
func servedVersion(t *testing.T, gitVersion string) kubernetes.Interface {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/version" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(apimachineryversion.Info{GitVersion: gitVersion, Major: "1", Minor: "x"})
	}))
	t.Cleanup(srv.Close)
	c, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCheckServerVersion(t *testing.T) {
	minimum, maximum := utilversion.MajorMinor(1, 36), utilversion.MajorMinor(1, 37)
	for _, tc := range []struct {
		server  string
		err     string // substring of the error; "" none
		finding bool
	}{
		{server: "v1.36.0"},
		{server: "v1.36.3"},
		{server: "v1.37.1-gke.1200"},
		{server: "v1.35.9", err: "the API server is Kubernetes v1.35.9; this Tessera needs 1.36 or later"},
		{server: "v1.30.14-eks-1234", err: "v1.30.14-eks-1234"},
		{server: "v2.0.0", finding: true},
		{server: "v1.38.0", finding: true},
		{server: "v0.0.0-master+$Format:%H$", finding: true},
		{server: "not-a-version", err: `the API server's version "not-a-version"`},
	} {
		f, err := CheckServerVersion(servedVersion(t, tc.server).Discovery(), minimum, maximum)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want one containing %q", tc.server, err, tc.err)
			}
			if strings.HasPrefix(tc.server, "v1.3") && !errors.Is(err, ErrUnsupportedKubernetes) {
				t.Errorf("%s: %v is not ErrUnsupportedKubernetes", tc.server, err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.server, err)
		case tc.finding != (f != nil):
			t.Errorf("%s: finding %v, want one: %v", tc.server, f, tc.finding)
		case f != nil && !strings.Contains(f.Message, tc.server):
			t.Errorf("%s: finding %q does not name the version", tc.server, f.Message)
		}
	}
	// An API server that does not answer is an error, not a pass.
	c, err := kubernetes.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := CheckServerVersion(c.Discovery(), minimum, maximum); err == nil || !strings.Contains(err.Error(), "asking the API server its version") {
		t.Errorf("unreachable API server: %v", err)
	}
}

// write creates file p (and its directories) with content s.
func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

func TestFindDriver(t *testing.T) {
	// NVIDIA's Ubuntu driver container: multiarch directory, relative
	// symlink to the versioned library.
	ubuntu := t.TempDir()
	write(t, filepath.Join(ubuntu, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05"), "elf")
	symlink(t, "libnvidia-ml.so.580.95.05", filepath.Join(ubuntu, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"))
	// RHEL: lib64, an absolute symlink that means the root's own path.
	rhel := t.TempDir()
	write(t, filepath.Join(rhel, "usr/lib64/libnvidia-ml.so.550.54.15"), "elf")
	symlink(t, "/usr/lib64/libnvidia-ml.so.550.54.15", filepath.Join(rhel, "usr/lib64/libnvidia-ml.so.1"))
	// Grace Hopper (arm64).
	arm := t.TempDir()
	write(t, filepath.Join(arm, "usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1"), "elf")
	// A symlink that leaves the root resolves inside it, where nothing is.
	escape := t.TempDir()
	symlink(t, "../../../../../../etc/hostname", filepath.Join(escape, "usr/lib64/libnvidia-ml.so.1"))
	empty := t.TempDir()
	write(t, filepath.Join(empty, "usr/lib/x86_64-linux-gnu/libc.so.6"), "elf")

	for _, tc := range []struct {
		root, arch, want string
	}{
		{ubuntu, "amd64", "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05"},
		{rhel, "amd64", "usr/lib64/libnvidia-ml.so.550.54.15"},
		{arm, "arm64", "usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1"},
		{ubuntu, "arm64", ""}, // an amd64 driver is no driver for arm64
		{escape, "amd64", ""},
		{empty, "amd64", ""},
		{filepath.Join(empty, "missing"), "amd64", ""},
	} {
		d, err := findDriver(tc.root, tc.arch)
		if tc.want == "" {
			if err == nil || !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), tc.root) {
				t.Errorf("%s (%s): %v, want ErrNoDriver naming the root", tc.root, tc.arch, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s (%s): %v", tc.root, tc.arch, err)
			continue
		}
		if d.NVML != filepath.Join(tc.root, tc.want) {
			t.Errorf("%s (%s): NVML %s, want %s", tc.root, tc.arch, d.NVML, tc.want)
		}
		if d.BinDir != filepath.Join(tc.root, "usr/bin") || !strings.HasPrefix(d.LibDir, tc.root) {
			t.Errorf("%s: dirs %s %s", tc.root, d.BinDir, d.LibDir)
		}
	}
	if _, err := findDriver(empty, "amd64"); err == nil || !strings.Contains(err.Error(), "/usr/lib64") || !strings.Contains(err.Error(), NVMLName) {
		t.Errorf("the error does not say where it looked: %v", err)
	}
}

const cdiSpec = `cdiVersion: "0.5.0"
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: GPU-aaaa
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  deviceNodes:
  - path: /dev/nvidiactl
`

func TestCheckCDISpecs(t *testing.T) {
	etc, run := t.TempDir(), t.TempDir()
	write(t, filepath.Join(run, "nvidia.yaml"), cdiSpec)
	dirs := []string{etc, run}
	if err := CheckCDISpecs(dirs, []string{"nvidia.com/gpu=GPU-aaaa"}); err != nil {
		t.Errorf("a spec naming the GPU: %v", err)
	}
	err := CheckCDISpecs(dirs, []string{"nvidia.com/gpu=GPU-aaaa", "nvidia.com/gpu=GPU-bbbb"})
	if err == nil || !strings.Contains(err.Error(), "nvidia.com/gpu=GPU-bbbb") || strings.Contains(err.Error(), "GPU-aaaa,") ||
		!strings.Contains(err.Error(), etc) || !strings.Contains(err.Error(), "nvidia-ctk cdi generate") {
		t.Errorf("a GPU in no spec: %v", err)
	}
	if err := CheckCDISpecs([]string{etc}, []string{"nvidia.com/gpu=GPU-aaaa"}); err == nil || !strings.Contains(err.Error(), "no CDI spec") {
		t.Errorf("no spec at all: %v", err)
	}
	write(t, filepath.Join(etc, "broken.yaml"), "cdiVersion: \"0.5.0\"\nkind: nvidia.com/gpu\ndevices: 3\n")
	if err := CheckCDISpecs([]string{etc}, []string{"nvidia.com/gpu=GPU-aaaa"}); err == nil || !strings.Contains(err.Error(), "broken.yaml") {
		t.Errorf("a malformed spec is not named: %v", err)
	}
}

func listen(t *testing.T, p string) {
	t.Helper()
	l, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
}

func TestForeignDevicePlugin(t *testing.T) {
	const res = "nvidia.com/gpu"
	node := func(alloc string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}}
		if alloc != "" {
			n.Status.Allocatable = corev1.ResourceList{res: resource.MustParse(alloc)}
		}
		return n
	}
	dir, err := os.MkdirTemp("", "dp") // short: a socket path has 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	listen(t, filepath.Join(dir, "kubelet.sock"))
	listen(t, filepath.Join(dir, "nvidia-gpu.sock"))
	write(t, filepath.Join(dir, "kubelet_internal_checkpoint"), "{}")

	f, err := ForeignDevicePlugin(node("8"), dir, res, "tessera-shim-gpu.sock")
	if err != nil || f == nil {
		t.Fatalf("NVIDIA's plugin serving 8 GPUs: %v %v", f, err)
	}
	for _, want := range []string{res, "gpu-1", "nvidia-gpu.sock", "8"} {
		if !strings.Contains(f.Message, want) {
			t.Errorf("the finding does not name %s: %s", want, f.Message)
		}
	}
	if strings.Contains(f.Message, "kubelet.sock") || strings.Contains(f.Message, "checkpoint") {
		t.Errorf("the finding names the kubelet's own files: %s", f.Message)
	}
	for name, n := range map[string]*corev1.Node{"no allocatable": node(""), "zero": node("0")} {
		if f, err := ForeignDevicePlugin(n, dir, res, "tessera-shim-gpu.sock"); f != nil || err != nil {
			t.Errorf("%s: %v %v", name, f, err)
		}
	}
	// Once Tessera's shim is registered, the kubelet's count is Tessera's.
	listen(t, filepath.Join(dir, "tessera-shim-gpu.sock"))
	if f, err := ForeignDevicePlugin(node("80"), dir, res, "tessera-shim-gpu.sock"); f != nil || err != nil {
		t.Errorf("Tessera registered: %v %v", f, err)
	}
	if _, err := ForeignDevicePlugin(node("8"), filepath.Join(dir, "missing"), res, "x.sock"); err == nil {
		t.Error("a missing device-plugin directory is not an error")
	}
}

func TestReport(t *testing.T) {
	client := fake.NewClientset()
	ctx := context.Background()
	s := Subject{Object: corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: "gpu-1"}, Component: "tessera-node-agent", Host: "gpu-1"}
	Report(ctx, client, s, errors.New("no NVIDIA driver under the driver root /driver-root"))
	Report(ctx, client, s, &Finding{Message: "another device plugin serves nvidia.com/gpu"})
	evs, err := client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) != 2 {
		t.Fatalf("%d events, want 2", len(evs.Items))
	}
	var msgs []string
	for _, e := range evs.Items {
		if e.Type != corev1.EventTypeWarning || e.Reason != Reason || e.InvolvedObject.Kind != "Node" || e.InvolvedObject.Name != "gpu-1" || e.Source.Component != "tessera-node-agent" {
			t.Errorf("event %+v", e)
		}
		msgs = append(msgs, e.Message)
	}
	if j := strings.Join(msgs, "|"); !strings.Contains(j, "/driver-root") || !strings.Contains(j, "another device plugin") {
		t.Errorf("messages %q", msgs)
	}
	// A subject in a namespace (the scheduler's Pod) gets its event there.
	Report(ctx, client, Subject{Object: corev1.ObjectReference{Kind: "Pod", Name: "sched-0", Namespace: "tessera-system"}, Component: "tessera-scheduler"}, errors.New("old"))
	if evs, _ := client.CoreV1().Events("tessera-system").List(ctx, metav1.ListOptions{}); len(evs.Items) != 1 {
		t.Errorf("scheduler event: %v", evs.Items)
	}
}
