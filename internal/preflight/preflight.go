// Package preflight holds the checks Tessera's components run at start
// against what they cannot control (docs/install.md, "Prerequisites"): the
// API server's version, the NVIDIA driver under the node agent's driver
// root, the CDI specs the container runtime needs for the cdi-cri device
// list strategy, and another device plugin serving the GPU resource. A
// check returns an error (or, for what is only doubtful, a Finding) whose
// text names what is missing and where it was looked for; Report writes it
// as a Warning event and to the log.
package preflight

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/tessera-gpu/tessera/internal/version"
)

// Reason is the reason of the events Report writes.
const Reason = "TesseraPrerequisite"

// ErrUnsupportedKubernetes: the API server is older than Tessera supports.
var ErrUnsupportedKubernetes = errors.New("unsupported Kubernetes version")

// SupportedKubernetes is the range of API server versions Tessera
// supports: from the minor of the kube-scheduler it links (Kubernetes'
// version skew policy: kube-scheduler must not be newer than the API
// server, and may be one minor older) to the next minor. Chart.yaml's
// kubeVersion says the same (a test compares).
func SupportedKubernetes() (minimum, maximum *utilversion.Version, err error) {
	linked := version.Kubernetes()
	v, err := utilversion.ParseGeneric(linked)
	if err != nil {
		return nil, nil, fmt.Errorf("the Kubernetes version this binary links (%q): %w", linked, err)
	}
	return utilversion.MajorMinor(v.Major(), v.Minor()), utilversion.MajorMinor(v.Major(), v.Minor()+1), nil
}

// CheckServerVersion asks the API server its version (GET /version) and
// returns ErrUnsupportedKubernetes, naming both versions, when it is older
// than minimum; a server newer than maximum's minor gives a Finding.
func CheckServerVersion(d discovery.ServerVersionInterface, minimum, maximum *utilversion.Version) (*Finding, error) {
	info, err := d.ServerVersion()
	if err != nil {
		return nil, fmt.Errorf("asking the API server its version: %w", err)
	}
	v, err := utilversion.ParseGeneric(info.GitVersion)
	if err != nil {
		return nil, fmt.Errorf("the API server's version %q: %w", info.GitVersion, err)
	}
	if v.Major() == 0 && v.Minor() == 0 {
		// An API server built from source without version stamping
		// ("v0.0.0-master+$Format:%H$": go build, go test's test server)
		// says nothing of its API level: warn, do not refuse.
		return &Finding{Message: fmt.Sprintf("the API server reports the unstamped version %s (a build from source): its Kubernetes version cannot be checked; this Tessera supports %d.%d to %d.%d",
			info.GitVersion, minimum.Major(), minimum.Minor(), maximum.Major(), maximum.Minor())}, nil
	}
	mm := utilversion.MajorMinor(v.Major(), v.Minor())
	if mm.LessThan(minimum) {
		return nil, fmt.Errorf("%w: the API server is Kubernetes %s; this Tessera needs %d.%d or later (its scheduler is kube-scheduler %d.%d, which must not be newer than the API server)",
			ErrUnsupportedKubernetes, info.GitVersion, minimum.Major(), minimum.Minor(), minimum.Major(), minimum.Minor())
	}
	if maximum.LessThan(mm) {
		return &Finding{Message: fmt.Sprintf("the API server is Kubernetes %s, newer than this Tessera was tested with (%d.%d to %d.%d): upgrade Tessera",
			info.GitVersion, minimum.Major(), minimum.Minor(), maximum.Major(), maximum.Minor())}, nil
	}
	return nil, nil
}

// NVMLName is the NVML library's file name.
const NVMLName = "libnvidia-ml.so.1"

// ErrNoDriver: no NVIDIA driver under the driver root.
var ErrNoDriver = errors.New("no NVIDIA driver")

// driverLibDirs are the directories, relative to a driver root, where
// drivers keep their libraries: Debian and Ubuntu's multiarch directories
// (NVIDIA's Ubuntu driver containers), RHEL's lib64, and the plain ones.
func driverLibDirs(goarch string) []string {
	multiarch := map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}[goarch]
	var dirs []string
	if multiarch != "" {
		dirs = append(dirs, "/usr/lib/"+multiarch, "/lib/"+multiarch)
	}
	return append(dirs, "/usr/lib64", "/lib64", "/usr/lib", "/lib")
}

// Driver is an NVIDIA driver found under a driver root: where its NVML
// is (as this process sees it), its library directory and its programs'
// directory.
type Driver struct {
	Root, NVML, LibDir, BinDir string
}

// FindDriver looks for NVML under root (the host directory where the
// driver is installed, mounted into the container: "/" for a driver on the
// host, /run/nvidia/driver for NVIDIA's driver container) in the
// directories drivers keep their libraries in. Symlinks are followed
// inside root, as the driver's own root sees them.
func FindDriver(root string) (*Driver, error) {
	return findDriver(root, runtime.GOARCH)
}

func findDriver(root, goarch string) (*Driver, error) {
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("%w: the driver root %s does not exist or is not a directory (mount the host's driver root there: \"/\" for a driver installed on the host, /run/nvidia/driver for NVIDIA's driver container)", ErrNoDriver, root)
	}
	dirs := driverLibDirs(goarch)
	for _, d := range dirs {
		p, err := resolveIn(root, path.Join(d, NVMLName))
		if err != nil {
			continue
		}
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return &Driver{Root: root, NVML: p, LibDir: filepath.Join(root, d), BinDir: filepath.Join(root, "usr/bin")}, nil
		}
	}
	return nil, fmt.Errorf("%w under the driver root %s: %s is in none of %s (is the driver installed, and is this the root it is installed under?)",
		ErrNoDriver, root, NVMLName, strings.Join(dirs, ", "))
}

// resolveIn resolves p's symlinks as if root were "/".
func resolveIn(root, p string) (string, error) {
	for range 40 {
		full := filepath.Join(root, p)
		fi, err := os.Lstat(full)
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			return full, nil
		}
		target, err := os.Readlink(full)
		if err != nil {
			return "", err
		}
		if !path.IsAbs(target) {
			target = path.Join(path.Dir(p), target)
		}
		p = path.Clean(target)
	}
	return "", fmt.Errorf("%s: too many symlinks", p)
}

// DefaultCDISpecDirs are the directories container runtimes read CDI
// specs from (containerd's and CRI-O's defaults).
var DefaultCDISpecDirs = []string{"/etc/cdi", "/var/run/cdi"}

// ErrNoCDISpec: a device the agent hands out is in no CDI spec.
var ErrNoCDISpec = errors.New("no CDI spec")

// CheckCDISpecs checks that the CDI specs in dirs describe every device
// (fully qualified names, "nvidia.com/gpu=GPU-…"): the container runtime
// resolves the agent's CDI device names through them.
func CheckCDISpecs(dirs, devices []string) error {
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dirs...), cdiapi.WithAutoRefresh(false))
	if err != nil && cache == nil {
		return fmt.Errorf("reading the CDI specs in %s: %w", strings.Join(dirs, ", "), err)
	}
	var missing []string
	for _, d := range devices {
		if cache.GetDevice(d) == nil {
			missing = append(missing, d)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	var bad []string
	for spec, errs := range cache.GetErrors() {
		bad = append(bad, fmt.Sprintf("%s: %v", spec, errors.Join(errs...)))
	}
	slices.Sort(bad)
	msg := fmt.Sprintf("%v in %s for %s (device list strategy cdi-cri; the container runtime could not start a GPU container): generate one with `nvidia-ctk cdi generate --device-name-strategy=uuid --output=/var/run/cdi/nvidia.yaml`, or use NVIDIA's runtime with nodeAgent.deviceListStrategy=envvar",
		ErrNoCDISpec, strings.Join(dirs, ", "), strings.Join(missing, ", "))
	if len(bad) > 0 {
		msg += "; specs with errors: " + strings.Join(bad, "; ")
	}
	return errors.New(msg)
}

// Finding is something a check found doubtful rather than wrong: the
// component goes on, and Report says it.
type Finding struct{ Message string }

func (f *Finding) Error() string { return f.Message }

// ForeignDevicePlugin reports another device plugin serving resource on
// node: the kubelet offers the resource (the Node's allocatable) while
// Tessera's kubelet shim has not registered it (its socket, shimSocket, is
// not in the kubelet's device-plugin directory pluginDir). The other
// sockets there are named as likely culprits (NVIDIA's device plugin's is
// nvidia-gpu.sock). With both registered the kubelet keeps whichever
// registered last, and the two hand out the same GPUs.
func ForeignDevicePlugin(node *corev1.Node, pluginDir, resource, shimSocket string) (*Finding, error) {
	q, ok := node.Status.Allocatable[corev1.ResourceName(resource)]
	if !ok || q.IsZero() {
		return nil, nil
	}
	entries, err := os.ReadDir(pluginDir)
	if err != nil {
		return nil, fmt.Errorf("the kubelet's device-plugin directory: %w", err)
	}
	var others []string
	for _, e := range entries {
		n := e.Name()
		if n == shimSocket {
			return nil, nil
		}
		if e.Type()&fs.ModeSocket != 0 && n != "kubelet.sock" && !strings.HasPrefix(n, "tessera-") {
			others = append(others, n)
		}
	}
	msg := fmt.Sprintf("another device plugin serves %s on node %s: the kubelet offers %s of it before Tessera registered it; disable the other plugin (the GPU Operator: devicePlugin.enabled=false, docs/install.md), or the two hand out the same GPUs",
		resource, node.Name, q.String())
	if len(others) > 0 {
		msg += fmt.Sprintf(" (other plugin sockets in %s: %s)", pluginDir, strings.Join(others, ", "))
	}
	return &Finding{Message: msg}, nil
}

// Subject is what Report's events are about.
type Subject struct {
	// Object is the event's object: the agent's Node, the scheduler's Pod.
	Object corev1.ObjectReference
	// Component and Host are the event's source.
	Component, Host string
	// Reason is the event's reason (empty: Reason).
	Reason string
}

// Report writes err (a failed check or a Finding) to the log and as a
// Warning event about s.Object; a failure to write the event is logged.
func Report(ctx context.Context, client kubernetes.Interface, s Subject, err error) {
	logger := klog.FromContext(ctx)
	var f *Finding
	if errors.As(err, &f) {
		logger.Info("Warning: prerequisite", "problem", f.Message)
	} else {
		logger.Error(err, "Prerequisite missing")
	}
	if client == nil || s.Object.Name == "" {
		return
	}
	ns := s.Object.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	now := metav1.NewTime(time.Now())
	msg := err.Error()
	if len(msg) > 1024 {
		msg = msg[:1021] + "..."
	}
	reason := s.Reason
	if reason == "" {
		reason = Reason
	}
	ev := &corev1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", s.Object.Name, now.UnixNano()), Namespace: ns},
		InvolvedObject:      s.Object,
		Reason:              reason,
		Message:             msg,
		Type:                corev1.EventTypeWarning,
		Source:              corev1.EventSource{Component: s.Component, Host: s.Host},
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
		ReportingController: "tessera.io/" + s.Component,
		ReportingInstance:   s.Component + "-" + s.Host,
	}
	if _, cerr := client.CoreV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{}); cerr != nil {
		logger.Error(cerr, "Could not write the prerequisite's event", "object", s.Object.Kind+"/"+s.Object.Name)
	}
}
