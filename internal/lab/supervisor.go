package lab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// supervisor runs the lab's components as child processes of the lab
// binary, restarts any that exits while the lab runs (as a node's
// systemd would), and stops them in order. Each child gets SIGKILL if the
// supervisor dies, so nothing outlives the lab.
type supervisor struct {
	exe     string // the tessera-lab binary
	logs    string
	logger  klog.Logger
	changed func() // a child started or restarted

	spawn chan spawnReq

	mu       sync.Mutex
	procs    map[string]*proc
	order    []string
	stopping bool
}

// proc is one supervised component.
type proc struct {
	name     string
	args     []string
	env      []string
	newNS    bool // own mount namespace (hollow kubelets)
	cmd      *exec.Cmd
	restarts int
	exited   chan struct{} // closed when the current cmd has exited
}

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

func newSupervisor(exe, logs string, logger klog.Logger, changed func()) *supervisor {
	s := &supervisor{exe: exe, logs: logs, logger: logger, changed: changed, spawn: make(chan spawnReq), procs: map[string]*proc{}}
	// Pdeathsig fires when the thread that started the child exits, so
	// every child is started from one thread that lives as long as the
	// supervisor.
	go func() {
		runtime.LockOSThread()
		for r := range s.spawn {
			r.done <- r.cmd.Start()
		}
	}()
	return s
}

// start launches a component (tessera-lab <args>) and keeps it running.
func (s *supervisor) start(name string, args []string, env []string, newNS bool) error {
	p := &proc{name: name, args: args, env: env, newNS: newNS}
	s.mu.Lock()
	if _, dup := s.procs[name]; dup {
		s.mu.Unlock()
		return fmt.Errorf("component %s started twice", name)
	}
	s.procs[name] = p
	s.order = append(s.order, name)
	s.mu.Unlock()
	if err := s.launch(p); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	return nil
}

func (s *supervisor) launch(p *proc) error {
	logFile, err := os.OpenFile(filepath.Join(s.logs, sanitize(p.name)+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.exe, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if p.newNS {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNS
		if os.Geteuid() != 0 {
			// Unprivileged: a user namespace in which we may mount.
			cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWUSER
			cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}}
			cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}
		}
	}
	fmt.Fprintf(logFile, "\n=== %s: starting %s %v\n", time.Now().Format(time.RFC3339), p.name, p.args)
	done := make(chan error, 1)
	s.spawn <- spawnReq{cmd: cmd, done: done}
	if err := <-done; err != nil {
		logFile.Close()
		return err
	}
	exited := make(chan struct{})
	s.mu.Lock()
	p.cmd, p.exited = cmd, exited
	s.mu.Unlock()
	if s.changed != nil {
		s.changed()
	}
	go s.watch(p, cmd, logFile, exited)
	return nil
}

// watch waits for the child to exit and restarts it unless the lab stops.
func (s *supervisor) watch(p *proc, cmd *exec.Cmd, logFile *os.File, exited chan struct{}) {
	err := cmd.Wait()
	fmt.Fprintf(logFile, "=== %s: %s exited: %v\n", time.Now().Format(time.RFC3339), p.name, err)
	logFile.Close()
	close(exited)
	backoff := time.Second
	for {
		s.mu.Lock()
		stopping := s.stopping
		if !stopping {
			p.restarts++
		}
		s.mu.Unlock()
		if stopping {
			return
		}
		s.logger.Info("Component exited; restarting", "component", p.name, "err", err, "restarts", p.restarts)
		time.Sleep(backoff)
		s.mu.Lock()
		stopping = s.stopping
		s.mu.Unlock()
		if stopping {
			return
		}
		if err = s.launch(p); err == nil {
			return
		}
		s.logger.Error(err, "Restart failed", "component", p.name)
		backoff = min(2*backoff, 10*time.Second)
	}
}

// components reports each child's PID and restarts.
func (s *supervisor) components() map[string]Component {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]Component{}
	for name, p := range s.procs {
		c := Component{Restarts: p.restarts}
		if p.cmd != nil && p.cmd.Process != nil {
			c.PID = p.cmd.Process.Pid
		}
		out[name] = c
	}
	return out
}

// alive reports whether the component's current process is running.
func (s *supervisor) alive(name string) bool {
	s.mu.Lock()
	p := s.procs[name]
	s.mu.Unlock()
	if p == nil || p.exited == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stopAll stops the components: every one but the first started (the API
// server) at once, then the first, so that none loses its API server
// while shutting down. Each gets SIGTERM, then SIGKILL after grace.
func (s *supervisor) stopAll(grace time.Duration) {
	s.mu.Lock()
	s.stopping = true
	order := append([]string(nil), s.order...)
	s.mu.Unlock()
	if len(order) == 0 {
		return
	}
	var wg sync.WaitGroup
	for _, name := range order[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.stop(name, grace)
		}()
	}
	wg.Wait()
	s.stop(order[0], grace)
}

func (s *supervisor) stop(name string, grace time.Duration) {
	s.mu.Lock()
	p := s.procs[name]
	cmd, exited := p.cmd, p.exited
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
}

// ProcessAlive reports whether a process with this PID exists.
func ProcessAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func sanitize(name string) string {
	out := []byte(name)
	for i, c := range out {
		if c == '/' {
			out[i] = '_'
		}
	}
	return string(out)
}
