// Package lab is the emulated GPU cluster behind tessera-lab: etcd
// (embedded), a kube-apiserver, the kube-controller-manager controllers
// that Deployments and Jobs need, Tessera's scheduler and webhook, and
// emulated GPU nodes, each a hollow kubelet (the real kubelet code with a
// fake container runtime and the real device manager) beside a real
// Tessera node agent over an emulated NVML. Everything runs on one
// machine: etcd inside the supervisor process (package etcd), every other
// component as its child process (packages supervisor, component), with
// their state in one directory (package labdir).
//
// This package starts and stops a lab (Up, Stop, Demo) and publishes its
// state (lab.json); its parts are the packages below it: the node modes
// (modes), credentials (pki), the emulated GPUs (nvmlemu, fakegpu), what
// the lab shows (status) and the demo (demo).
package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/atomicfile"
	"github.com/tessera-gpu/tessera/internal/lab/demo"
	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/lab/modes"
	"github.com/tessera-gpu/tessera/internal/lab/supervisor"
	"github.com/tessera-gpu/tessera/internal/lab/tools"
)

// Config is what `tessera-lab up` starts.
type Config struct {
	Dir   labdir.Dir
	Nodes []modes.NodeSpec
	// Exe is the tessera-lab binary the components run from.
	Exe string
	// Tools are the containers' tools (default: tools.Default).
	Tools tools.Dir
	// NodeConfig are node agent profiles to add to the lab's (the data of
	// the --node-config ConfigMap; modes.ReadNodeConfig).
	NodeConfig map[string]string
	// Out receives progress lines.
	Out io.Writer
	// ReadyTimeout bounds the wait for every component (default 3m).
	ReadyTimeout time.Duration
	// Volcano, if set, holds Volcano's binaries and CRDs: the lab runs
	// Volcano's scheduler and controller manager (volcano.go).
	Volcano VolcanoBinaries
}

// State is what a running lab publishes in lab.json for status, down and
// tests.
type State struct {
	PID        int              `json:"pid"`
	Started    time.Time        `json:"started"`
	Ready      bool             `json:"ready"`
	Stopped    bool             `json:"stopped,omitempty"`
	APIServer  string           `json:"apiServer"`
	Kubeconfig string           `json:"kubeconfig"`
	Nodes      []modes.NodeSpec `json:"nodes"`
	// Components maps each child process's name (kube-apiserver,
	// scheduler, kubelet/<node>, node-agent/<node>, …) to its PID and
	// restart count.
	Components map[string]supervisor.Component `json:"components"`
}

// ReadState reads the lab's lab.json.
func ReadState(d labdir.Dir) (*State, error) {
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

func writeState(d labdir.Dir, s *State) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(d.StateFile(), append(b, '\n'), 0o644)
}

// Alive reports whether the lab's supervisor process still runs.
func (s *State) Alive() bool { return !s.Stopped && supervisor.ProcessAlive(s.PID) }

// Stop asks the lab's supervisor to stop (SIGTERM, as Ctrl-C does) and
// waits until it has; after timeout it kills it, and with it every
// component (they die with their parent).
func Stop(ctx context.Context, d labdir.Dir, timeout time.Duration) error {
	st, err := ReadState(d)
	if err != nil || !st.Alive() {
		return nil // nothing runs
	}
	if err := syscall.Kill(st.PID, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stopping the lab (pid %d): %w", st.PID, err)
	}
	deadline := time.Now().Add(timeout)
	for supervisor.ProcessAlive(st.PID) {
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

// Demo starts the lab, runs the demo (package demo) once it serves, and
// stops the lab.
func Demo(ctx context.Context, cfg Config) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := cfg.Out
	if out == nil {
		out = io.Discard
	}
	var demoErr error
	err := Up(ctx, cfg, func(st *State, client kubernetes.Interface) {
		defer cancel()
		demoErr = demo.Run(ctx, cfg.Dir, st.Nodes, client, out)
	})
	if err != nil {
		return err
	}
	return demoErr
}
