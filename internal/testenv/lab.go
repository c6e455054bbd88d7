package testenv

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// LabRun is `tessera-lab up` running as a child process, for the tests
// that drive the emulated cluster as a user would (test/integration/lab,
// test/integration/volcano).
type LabRun struct {
	// Dir is the lab's state directory (labdir.Dir).
	Dir    string
	cmd    *exec.Cmd
	out    lockedBuffer
	exited chan error
}

// lockedBuffer is the lab's output, written by the child's pipes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// StartLab runs `bin up --dir dir args…` and waits until the lab says it
// is ready, at most timeout. A killed test run takes its lab down with it.
func StartLab(bin, dir string, timeout time.Duration, args ...string) (*LabRun, error) {
	l := &LabRun{Dir: dir, exited: make(chan error, 1)}
	l.cmd = exec.Command(bin, append([]string{"up", "--dir", dir}, args...)...)
	l.cmd.Stdout, l.cmd.Stderr = &l.out, &l.out
	l.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	start := time.Now()
	if err := l.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { l.exited <- l.cmd.Wait() }()
	for {
		if labReady(dir) {
			return l, nil
		}
		select {
		case err := <-l.exited:
			return nil, fmt.Errorf("tessera-lab up exited: %v\n%s", err, l.out.String())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Since(start) > timeout {
			l.Stop()
			return nil, fmt.Errorf("lab not ready after %v\n%s", timeout, l.out.String())
		}
	}
}

// Stop stops the lab (SIGTERM, then SIGKILL after 90 s).
func (l *LabRun) Stop() {
	_ = l.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-l.exited:
	case <-time.After(90 * time.Second):
		_ = l.cmd.Process.Kill()
	}
}

// Output is what `tessera-lab up` printed so far.
func (l *LabRun) Output() string { return l.out.String() }

// DumpLogs writes the last lines of every component's log, after a
// failure.
func (l *LabRun) DumpLogs(w io.Writer, lines int) {
	logs, _ := filepath.Glob(filepath.Join(l.Dir, "logs", "*.log"))
	for _, f := range logs {
		b, _ := os.ReadFile(f)
		ls := strings.Split(string(b), "\n")
		if len(ls) > lines {
			ls = ls[len(ls)-lines:]
		}
		fmt.Fprintf(w, "--- %s\n%s\n", filepath.Base(f), strings.Join(ls, "\n"))
	}
}

// BuildLab builds, into dir, tessera-lab (with the Kubernetes version
// flags), a kubectl from the pinned module and the lab containers' tools
// (make lab-tools), and returns their paths.
func BuildLab(dir string) (labBin, kubectlBin, tools string, err error) {
	tools = filepath.Join(dir, "tools")
	if labBin, err = BuildWith(dir, "tessera-lab", "./cmd/tessera-lab", KubernetesBuildFlags()); err != nil {
		return "", "", "", err
	}
	if kubectlBin, err = BuildKubectl(dir); err != nil {
		return "", "", "", err
	}
	return labBin, kubectlBin, tools, Make("", "lab-tools", "LAB_TOOLS="+tools)
}

// labReady reads the lab's lab.json (internal/lab.State, which this
// package cannot import: the lab links the scheduler, whose tests use
// this package) for its ready flag.
func labReady(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "lab.json"))
	if err != nil {
		return false
	}
	var st struct {
		Ready bool `json:"ready"`
	}
	return json.Unmarshal(b, &st) == nil && st.Ready
}
