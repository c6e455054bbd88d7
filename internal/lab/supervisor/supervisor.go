// Package supervisor runs the emulated cluster's components as child
// processes of the lab binary, as a node's systemd would: it restarts any
// that exits while the lab runs, reports their PIDs and restarts, and
// stops them in order. Each child gets SIGKILL if the supervisor dies, so
// nothing outlives the lab.
package supervisor

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// Supervisor runs and restarts the components.
type Supervisor struct {
	exe     string                   // the binary every component runs
	logFile func(name string) string // a component's log file
	logger  klog.Logger
	changed func() // a child started or restarted

	spawn chan spawnReq
	// stopped is closed when StopAll begins: a restart pending ends.
	stopped chan struct{}

	mu       sync.Mutex
	procs    map[string]*proc
	order    []string
	stopping bool
	// watchers counts the goroutines that wait for a child and restart
	// it (only they restart one); StopAll returns once it is 0, so no
	// component starts after it.
	watchers int
	idle     *sync.Cond // signalled when watchers drops
}

// Component is one supervised child process, as reported.
type Component struct {
	PID      int `json:"pid"`
	Restarts int `json:"restarts"`
}

// proc is one supervised component.
type proc struct {
	name     string
	exe      string // the binary (the supervisor's, unless StartExe names another)
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

// errStopping refuses a start or restart once StopAll has begun.
var errStopping = errors.New("the supervisor is stopping")

// New returns a supervisor of components that run exe, each logging to
// logFile(its name) (appended across restarts); changed, if not nil, is
// called whenever a component starts or restarts.
func New(exe string, logFile func(name string) string, logger klog.Logger, changed func()) *Supervisor {
	s := &Supervisor{exe: exe, logFile: logFile, logger: logger, changed: changed, spawn: make(chan spawnReq), stopped: make(chan struct{}), procs: map[string]*proc{}}
	s.idle = sync.NewCond(&s.mu)
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

// Start launches a component (exe args…, with env added to this process's
// environment; newNS: in a mount namespace of its own) and keeps it
// running.
func (s *Supervisor) Start(name string, args []string, env []string, newNS bool) error {
	return s.start(&proc{name: name, exe: s.exe, args: args, env: env, newNS: newNS})
}

// StartExe launches a component that is another binary (exe args…, with
// env added to this process's environment) and keeps it running: the
// real node's containerd, kubelet and kube-proxy beside the lab's control
// plane.
func (s *Supervisor) StartExe(name, exe string, args []string, env []string) error {
	return s.start(&proc{name: name, exe: exe, args: args, env: env})
}

func (s *Supervisor) start(p *proc) error {
	name := p.name
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

func (s *Supervisor) launch(p *proc) error {
	logFile, err := os.OpenFile(s.logFile(p.name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.exe, p.args...)
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
	// Started and published under the lock that StopAll takes to begin:
	// a component is either started before StopAll begins, and stopped by
	// it, or not at all.
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		logFile.Close()
		return errStopping
	}
	fmt.Fprintf(logFile, "\n=== %s: starting %s %v\n", time.Now().Format(time.RFC3339), p.name, p.args)
	done := make(chan error, 1)
	s.spawn <- spawnReq{cmd: cmd, done: done}
	if err := <-done; err != nil {
		s.mu.Unlock()
		logFile.Close()
		return err
	}
	exited := make(chan struct{})
	p.cmd, p.exited = cmd, exited
	s.watchers++
	s.mu.Unlock()
	if s.changed != nil {
		s.changed()
	}
	go s.watch(p, cmd, logFile, exited)
	return nil
}

// watch waits for the child to exit and restarts it unless the lab stops.
func (s *Supervisor) watch(p *proc, cmd *exec.Cmd, logFile *os.File, exited chan struct{}) {
	defer func() {
		s.mu.Lock()
		s.watchers--
		s.idle.Broadcast()
		s.mu.Unlock()
	}()
	err := cmd.Wait()
	fmt.Fprintf(logFile, "=== %s: %s exited: %v\n", time.Now().Format(time.RFC3339), p.name, err)
	logFile.Close()
	close(exited)
	backoff := time.Second
	for {
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			return
		}
		p.restarts++
		restarts := p.restarts
		s.mu.Unlock()
		s.logger.Info("Component exited; restarting", "component", p.name, "err", err, "restarts", restarts)
		select {
		case <-s.stopped:
			return
		case <-time.After(backoff):
		}
		if err = s.launch(p); err == nil || errors.Is(err, errStopping) {
			return
		}
		s.logger.Error(err, "Restart failed", "component", p.name)
		backoff = min(2*backoff, 10*time.Second)
	}
}

// Components reports each child's PID and restarts.
func (s *Supervisor) Components() map[string]Component {
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

// Alive reports whether the component's current process is running.
func (s *Supervisor) Alive(name string) bool {
	s.mu.Lock()
	p := s.procs[name]
	var exited chan struct{}
	if p != nil {
		exited = p.exited
	}
	s.mu.Unlock()
	if exited == nil {
		return false
	}
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// StopAll stops the components: every one but the first started (the API
// server) at once, then the first, so that none loses its API server
// while shutting down. Each gets SIGTERM, then SIGKILL after grace. It
// returns once every component has exited and none will be restarted.
func (s *Supervisor) StopAll(grace time.Duration) {
	s.mu.Lock()
	if !s.stopping {
		s.stopping = true
		close(s.stopped)
	}
	order := append([]string(nil), s.order...)
	s.mu.Unlock()
	if len(order) > 0 {
		var wg sync.WaitGroup
		for _, name := range order[1:] {
			wg.Go(func() { s.stop(name, grace) })
		}
		wg.Wait()
		s.stop(order[0], grace)
	}
	s.mu.Lock()
	for s.watchers > 0 {
		s.idle.Wait()
	}
	s.mu.Unlock()
}

func (s *Supervisor) stop(name string, grace time.Duration) {
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
