// Package lab is the emulated GPU cluster behind tessera-lab: etcd
// (embedded), a kube-apiserver, the kube-controller-manager controllers
// that Deployments and Jobs need, Tessera's scheduler and webhook, and
// emulated GPU nodes, each a hollow kubelet (the real kubelet code with a
// fake container runtime and the real device manager) beside a real
// Tessera node agent over go-nvml's mock NVML. Everything runs on one
// machine: etcd inside the supervisor process (package etcd), every other
// component as its child process, with their state in one directory.
package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/internal/atomicfile"
	"github.com/tessera-gpu/tessera/internal/nodeagent/nvmltest"
)

// NodeSpec is one emulated GPU node.
type NodeSpec struct {
	Name  string `json:"name"`
	Model string `json:"model"`
	GPUs  int    `json:"gpus"`
	// Mode is the node's mode (Modes).
	Mode string `json:"mode"`
	// Labels are the Node's labels (e.g. tessera.io/node-config, which
	// picks the node agent's profile, and nvidia.com/mig.config).
	Labels map[string]string `json:"labels,omitempty"`
	// Taints are the Node's taints.
	Taints []corev1.Taint `json:"taints,omitempty"`
}

// Uniform returns n fractional nodes of gpus GPUs of one model, named
// lab-gpu-01…
func Uniform(n, gpus int, model string) ([]NodeSpec, error) {
	if n < 1 || n > 64 {
		return nil, fmt.Errorf("--nodes %d: want 1 to 64", n)
	}
	m, err := ModeNamed(FractionalMode)
	if err != nil {
		return nil, err
	}
	var out []NodeSpec
	for i := range n {
		out = append(out, m.spec(fmt.Sprintf("lab-gpu-%02d", i+1), model, gpus))
	}
	return out, validate(out)
}

var groupRE = regexp.MustCompile(`^(\d+)x([A-Za-z0-9-]+):(\d+)(?:@([a-z0-9-]+))?$`)

// Validate checks a list of nodes as Up will start them.
func Validate(nodes []NodeSpec) error {
	if len(nodes) == 0 || len(nodes) > 64 {
		return fmt.Errorf("%d nodes, want 1 to 64", len(nodes))
	}
	return validate(nodes)
}

// ParseNodes reads a heterogeneous node list such as
// "2xA100-40GB:8,1xH100-80GB:4@time-slicing" (count x model : GPUs per
// node, and the nodes' mode when not fractional). Fractional nodes are
// named lab-gpu-01…, the others lab-<mode>-01….
func ParseNodes(s string) ([]NodeSpec, error) {
	var out []NodeSpec
	perMode := map[string]int{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		m := groupRE.FindStringSubmatch(part)
		if m == nil {
			return nil, fmt.Errorf("--node-groups entry %q: want COUNTxMODEL:GPUS[@MODE], e.g. 2xA100-40GB:8 or 1xA100-40GB:1@time-slicing", part)
		}
		count, _ := strconv.Atoi(m[1])
		gpus, _ := strconv.Atoi(m[3])
		modeName := m[4]
		if modeName == "" {
			modeName = FractionalMode
		}
		mode, err := ModeNamed(modeName)
		if err != nil {
			return nil, fmt.Errorf("--node-groups entry %q: %w", part, err)
		}
		prefix := "lab-" + mode.Name
		if mode.Name == FractionalMode {
			prefix = "lab-gpu"
		}
		for range count {
			perMode[mode.Name]++
			out = append(out, mode.spec(fmt.Sprintf("%s-%02d", prefix, perMode[mode.Name]), m[2], gpus))
		}
	}
	if len(out) == 0 || len(out) > 64 {
		return nil, fmt.Errorf("--node-groups %q: %d nodes, want 1 to 64", s, len(out))
	}
	return out, validate(out)
}

// validate builds each node's mock once, so a bad model or GPU count is
// reported before anything starts, and checks that names are unique.
func validate(nodes []NodeSpec) error {
	seen := map[string]bool{}
	for _, n := range nodes {
		if seen[n.Name] {
			return fmt.Errorf("node %s given twice", n.Name)
		}
		seen[n.Name] = true
		if _, err := nvmltest.NewModel(n.Model, n.GPUs, n.Name); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return nil
}

// Dir is the lab's state directory and the layout inside it.
type Dir string

// DefaultDir is $HOME/.tessera-lab (or a directory under the temporary
// directory when there is no home).
func DefaultDir() string {
	if home, err := os.UserHomeDir(); err == nil && home != "" && home != "/" {
		return filepath.Join(home, ".tessera-lab")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("tessera-lab-%d", os.Getuid()))
}

func (d Dir) path(p ...string) string { return filepath.Join(append([]string{string(d)}, p...)...) }

// Kubeconfig is the cluster-admin kubeconfig users and tools take.
func (d Dir) Kubeconfig() string { return d.path("kubeconfig") }

// StateFile describes the running lab (State).
func (d Dir) StateFile() string { return d.path("lab.json") }

// Logs holds one log file per component.
func (d Dir) Logs() string { return d.path("logs") }

// Node is an emulated node's directory; its kubelet's root directory is
// Node(name)/kubelet and the containers its fake runtime created are in
// Containers(name).
func (d Dir) Node(name string) string { return d.path("nodes", name) }

// Containers holds one JSON file (hollowkubelet.Container) per container
// of the node's runtime.
func (d Dir) Containers(node string) string { return d.path("nodes", node, "containers") }

// nodeDir is one node's directory and the layout inside it.
type nodeDir string

func (n nodeDir) path(p ...string) string { return filepath.Join(append([]string{string(n)}, p...)...) }

// criSocket is where the node's container runtime serves the kubelet.
func (n nodeDir) criSocket() string { return n.path("cri.sock") }

// limiter is the limiter library the node's agent mounts into containers.
func (n nodeDir) limiter() string { return n.path("limiter", "libtessera-limiter.so") }

// State is what a running lab publishes in lab.json for status, down and
// tests.
type State struct {
	PID        int        `json:"pid"`
	Started    time.Time  `json:"started"`
	Ready      bool       `json:"ready"`
	Stopped    bool       `json:"stopped,omitempty"`
	APIServer  string     `json:"apiServer"`
	Kubeconfig string     `json:"kubeconfig"`
	Nodes      []NodeSpec `json:"nodes"`
	// Components maps each child process's name (apiserver, scheduler,
	// kubelet/<node>, node-agent/<node>, …) to its PID and restart count.
	Components map[string]Component `json:"components"`
}

// Component is one supervised child process.
type Component struct {
	PID      int `json:"pid"`
	Restarts int `json:"restarts"`
}

// ReadState reads lab.json.
func (d Dir) ReadState() (*State, error) {
	b, err := os.ReadFile(d.StateFile())
	if err != nil {
		if os.IsNotExist(err) {
			return nil, fmt.Errorf("no lab in %s (start one with `tessera-lab up`)", d)
		}
		return nil, err
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", d.StateFile(), err)
	}
	return &s, nil
}

func (d Dir) writeState(s *State) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(d.StateFile(), append(b, '\n'), 0o644)
}

// Alive reports whether the lab's supervisor process still runs.
func (s *State) Alive() bool { return !s.Stopped && ProcessAlive(s.PID) }

// Stop asks the lab's supervisor to stop (SIGTERM, as Ctrl-C does) and
// waits until it has; after timeout it kills it, and with it every
// component (they die with their parent).
func Stop(ctx context.Context, d Dir, timeout time.Duration) error {
	st, err := d.ReadState()
	if err != nil || !st.Alive() {
		return nil // nothing runs
	}
	if err := syscall.Kill(st.PID, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stopping the lab (pid %d): %w", st.PID, err)
	}
	deadline := time.Now().Add(timeout)
	for ProcessAlive(st.PID) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(st.PID, syscall.SIGKILL)
			time.Sleep(time.Second)
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}
