package hollowkubelet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	apitest "k8s.io/cri-api/pkg/apis/testing"

	"github.com/tessera-gpu/tessera/internal/hollowkubelet/cinit"
)

// process is a running container: the host process of its init, which
// executes the container's command as PID 1 of a PID namespace of its
// own. When it exits the kernel kills whatever else runs in the
// container, so nothing outlives it.
type process struct {
	scratch string
	cmd     *exec.Cmd
	log     *criLog
	done    chan struct{} // closed once it has exited and its status is recorded
}

// stop ends the container: SIGTERM, then SIGKILL once grace has passed (at
// once with no grace), and waits until it has exited. Like any PID 1 in a
// PID namespace, a command that installed no SIGTERM handler ignores
// SIGTERM and is killed when the grace period ends.
func (p *process) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	if grace > 0 {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
			return
		case <-time.After(grace):
		}
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// spawner starts every container from one OS thread that lives as long as
// the runtime: the parent-death signal that takes a container down with
// its runtime fires when the thread that started it exits.
var spawner = sync.OnceValue(func() chan spawnReq {
	ch := make(chan spawnReq)
	go func() {
		runtime.LockOSThread()
		for r := range ch {
			r.done <- r.cmd.Start()
		}
	}()
	return ch
})

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

func spawn(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	spawner() <- spawnReq{cmd: cmd, done: done}
	return <-done
}

// start starts the container's process and returns once its command runs,
// or with the reason it could not be started.
func (r *Runtime) start(c *container) error {
	r.mu.Lock()
	if c.proc != nil {
		r.mu.Unlock()
		return fmt.Errorf("container %s already started", c.rec.ID)
	}
	rec, spec := c.rec, c.spec
	rec.Env = make(map[string]string, len(c.rec.Env))
	for k, v := range c.rec.Env {
		rec.Env[k] = v
	}
	spec.Mounts = append([]cinit.Mount(nil), c.spec.Mounts...)
	r.mu.Unlock()

	if r.opts.Prepare != nil {
		if err := r.opts.Prepare(&rec, &spec); err != nil {
			return err
		}
	}
	spec.Env = envList(rec.Env)
	spec.Scratch = filepath.Join(r.opts.RunDir, rec.ID)
	if err := spec.Validate(); err != nil {
		return err
	}
	for _, m := range spec.Mounts {
		if err := ensureSource(m.Source); err != nil {
			return fmt.Errorf("mount %s: %w", m.Target, err)
		}
	}
	if err := os.RemoveAll(spec.Scratch); err != nil {
		return err
	}
	if err := os.MkdirAll(spec.Scratch, 0o700); err != nil {
		return err
	}
	logPath := rec.LogPath
	if logPath == "" {
		logPath = spec.Scratch + ".log" // no log asked for: kept beside the scratch directory
	}
	log, err := openCRILog(logPath)
	if err != nil {
		return fmt.Errorf("container log: %w", err)
	}
	p, err := r.launch(&spec, log, func(pid int) error {
		if r.opts.Cgroups != nil {
			if err := r.opts.Cgroups.Place(rec.PodUID, rec.ID, pid); err != nil {
				return err
			}
		}
		return runHooks(rec, StageCreateContainer, pid, spec.Scratch)
	})
	if err != nil {
		_ = os.RemoveAll(spec.Scratch)
		r.poststop(rec, spec.Scratch)
		r.removeCgroup(rec)
		return err
	}
	now := time.Now()
	r.mu.Lock()
	c.proc = p
	c.rec.Env, c.rec.Mounts, c.rec.GPUs = rec.Env, mountsOf(spec.Mounts), rec.GPUs
	r.mu.Unlock()
	r.setState(rec.ID, func(fc *apitest.FakeContainer) {
		fc.State, fc.StartedAt = runtimeapi.ContainerState_CONTAINER_RUNNING, now.UnixNano()
	})
	r.updated(c, func(rc *Container) { rc.PID, rc.Started = p.cmd.Process.Pid, now })
	r.procs.Add(1)
	go func() {
		defer r.procs.Done()
		<-p.done
		r.poststop(rec, spec.Scratch)
		r.removeCgroup(rec)
		code := exitCode(p.cmd.ProcessState)
		end := time.Now()
		reason := "Completed"
		if code != 0 {
			reason = "Error"
		}
		r.setState(rec.ID, func(fc *apitest.FakeContainer) {
			fc.State, fc.FinishedAt, fc.ExitCode, fc.Reason = runtimeapi.ContainerState_CONTAINER_EXITED, end.UnixNano(), code, reason
		})
		r.updated(c, func(rc *Container) { rc.ExitCode, rc.Finished = &code, end })
	}()
	return nil
}

// poststop runs the container's poststop hooks once it has exited; their
// failures are logged (as runc does, they do not stop the removal).
func (r *Runtime) poststop(rec Container, bundle string) {
	if err := runHooks(rec, StagePoststop, 0, bundle); err != nil {
		r.logger().Error(err, "Container's poststop hook", "pod", rec.Namespace+"/"+rec.Pod, "container", rec.Name)
	}
}

// ociState is the OCI runtime state a hook reads on its standard input.
type ociState struct {
	OCIVersion string `json:"ociVersion"`
	ID         string `json:"id"`
	Status     string `json:"status"`
	PID        int    `json:"pid,omitempty"`
	Bundle     string `json:"bundle"`
}

// runHooks runs the container's hooks of a stage in order, with the OCI
// state on their standard input (pid 0: the container has stopped); the
// first that fails, or runs past its timeout, is the error.
func runHooks(rec Container, stage string, pid int, bundle string) error {
	status := "created"
	if pid == 0 {
		status = "stopped"
	}
	state, err := json.Marshal(ociState{OCIVersion: "1.2.0", ID: rec.ID, Status: status, PID: pid, Bundle: bundle})
	if err != nil {
		return err
	}
	for _, h := range rec.Hooks {
		if h.Stage != stage {
			continue
		}
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if h.Timeout > 0 {
			ctx, cancel = context.WithTimeout(ctx, time.Duration(h.Timeout)*time.Second)
		}
		cmd := exec.CommandContext(ctx, h.Path)
		if len(h.Args) > 0 {
			cmd.Args = h.Args
		}
		cmd.Env = h.Env
		cmd.Stdin = bytes.NewReader(state)
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			return fmt.Errorf("%s hook %s: %v: %s", stage, h.Path, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// removeCgroup removes the container's cgroup once it has exited.
func (r *Runtime) removeCgroup(rec Container) {
	if r.opts.Cgroups == nil {
		return
	}
	if err := r.opts.Cgroups.Remove(rec.PodUID, rec.ID, 5*time.Second); err != nil {
		r.logger().Error(err, "Container exited; its cgroup stays", "pod", rec.Namespace+"/"+rec.Pod, "container", rec.Name)
	}
}

// launch starts the init with the spec, lets place see its PID before the
// init has read its spec (so before the container's command runs), and
// waits until it has executed the command (or failed to).
func (r *Runtime) launch(spec *cinit.Spec, log *criLog, place func(pid int) error) (*process, error) {
	var pipes []*os.File
	closeAll := func() {
		for _, f := range pipes {
			f.Close()
		}
	}
	pipe := func() (*os.File, *os.File, error) {
		rd, wr, err := os.Pipe()
		if err == nil {
			pipes = append(pipes, rd, wr)
		}
		return rd, wr, err
	}
	specR, specW, err1 := pipe()
	errR, errW, err2 := pipe()
	outR, outW, err3 := pipe()
	serrR, serrW, err4 := pipe()
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		closeAll()
		log.close()
		return nil, err
	}
	cmd := &exec.Cmd{
		Path: r.opts.Init, Args: []string{"tessera-lab-init"}, Env: []string{},
		Stdout: outW, Stderr: serrW, ExtraFiles: []*os.File{specR, errW},
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC,
			Pdeathsig:  syscall.SIGKILL,
		},
	}
	if err := spawn(cmd); err != nil {
		closeAll()
		log.close()
		return nil, fmt.Errorf("starting %s: %w", r.opts.Init, err)
	}
	for _, f := range []*os.File{specR, errW, outW, serrW} {
		f.Close() // the child's ends
	}
	var copies sync.WaitGroup
	copies.Add(2)
	go func() { defer copies.Done(); log.copy(runtimeapi.Stdout, outR); outR.Close() }()
	go func() { defer copies.Done(); log.copy(runtimeapi.Stderr, serrR); serrR.Close() }()
	p := &process{scratch: spec.Scratch, cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		copies.Wait()
		log.close()
		close(p.done)
	}()
	if err := place(cmd.Process.Pid); err != nil {
		specW.Close()
		errR.Close()
		_ = cmd.Process.Kill()
		<-p.done
		return nil, err
	}
	encErr := json.NewEncoder(specW).Encode(spec)
	specW.Close()
	msg, _ := io.ReadAll(errR)
	errR.Close()
	if encErr != nil || len(msg) > 0 {
		_ = cmd.Process.Kill()
		<-p.done
		if len(msg) == 0 {
			return nil, fmt.Errorf("sending the container's spec: %w", encErr)
		}
		return nil, errors.New(strings.TrimSpace(string(msg)))
	}
	return p, nil
}

// exitCode is a container's exit code: the command's, or 128 + the
// signal that killed it, as container runtimes report it.
func exitCode(ps *os.ProcessState) int32 {
	if ps == nil {
		return 128
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int32(ws.Signal())
	}
	return int32(ps.ExitCode())
}

// terminationFile matches the kubelet's termination-message files
// (<root>/pods/<uid>/containers/<container>/<id>), which its fake OS
// layer never creates.
var terminationFile = regexp.MustCompile(`/pods/[^/]+/containers/[^/]+/[^/]+$`)

// ensureSource creates a bind mount's missing source: a directory, as
// containerd does, or an empty file for a termination-message file.
func ensureSource(path string) error {
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if !terminationFile.MatchString(path) {
		return os.MkdirAll(path, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func mountsOf(ms []cinit.Mount) []Mount {
	out := make([]Mount, len(ms))
	for i, m := range ms {
		out[i] = Mount{HostPath: m.Source, ContainerPath: m.Target, ReadOnly: m.ReadOnly}
	}
	return out
}
