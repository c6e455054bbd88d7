// Package mpsfake stands in for nvidia-cuda-mps-control where there is no
// GPU (the emulated cluster, tests). It answers the commands the node
// agent sends the way driver 535's control daemon does (measured: answers
// on stdout, exit status 0 whatever the answer, 1 when no daemon runs;
// thread percentages echoed with one decimal, invalid ones refused by
// echoing the old value; pinned limits read back in whole GiB from 1 GiB
// on) and records every command it receives in the log directory's
// control.log ("Cmd:<command>"), as the real one does, so tests and the
// lab can read what the agent told it. It starts no MPS server: no client
// ever connects without a GPU.
package mpsfake

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Main runs the fake with args as nvidia-cuda-mps-control gets them ("-d",
// "-f", or none for the front end). self is the command that runs this
// fake again (for -d, which starts the daemon in the background). It
// returns the exit status.
func Main(self []string, args []string, stdin io.Reader, stdout io.Writer) int {
	pipe := envOr("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
	logDir := envOr("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
	sock := filepath.Join(pipe, "control")
	switch {
	case len(args) == 1 && args[0] == "-d":
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			fmt.Fprintln(stdout, "An instance of this daemon is already running")
			return 1
		}
		cmd := exec.Command(self[0], append(append([]string(nil), self[1:]...), "-f")...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		// Unlike the real daemon, the fake ends with the process that
		// started it (the node agent, a test), so none is left behind.
		cmd.Env = os.Environ()
		if os.Getenv(envOwner) == "" {
			cmd.Env = append(cmd.Env, fmt.Sprintf("%s=%d", envOwner, os.Getppid()))
		}
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(stdout, err)
			return 1
		}
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if c, err := net.Dial("unix", sock); err == nil {
				c.Close()
				_ = cmd.Process.Release()
				return 0
			}
		}
		fmt.Fprintln(stdout, "control daemon did not start")
		return 1
	case len(args) == 1 && args[0] == "-f":
		return serve(pipe, logDir, sock)
	case len(args) == 0:
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			c, err := net.Dial("unix", sock)
			if err != nil {
				fmt.Fprintln(stdout, "Cannot find MPS control daemon process")
				return 1
			}
			fmt.Fprintln(c, sc.Text())
			b, _ := io.ReadAll(c)
			c.Close()
			if len(b) > 0 {
				fmt.Fprint(stdout, string(b))
			}
		}
		return 0
	}
	fmt.Fprintf(stdout, "usage: nvidia-cuda-mps-control [-d | -f]\n")
	return 2
}

// envOwner names the process whose end ends the fake daemon.
const envOwner = "TESSERA_FAKE_MPS_OWNER"

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

type state struct {
	mu      sync.Mutex
	pct     float64
	pinned  map[string]int64 // device → MiB
	log     *os.File
	quit    chan struct{}
	stopped bool
}

func serve(pipe, logDir, sock string) int {
	if err := os.MkdirAll(pipe, 0o755); err != nil {
		return 1
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return 1
	}
	lf, err := os.OpenFile(filepath.Join(logDir, "control.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return 1
	}
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return 1
	}
	_ = os.WriteFile(filepath.Join(pipe, "control.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644)
	s := &state{pct: 100, pinned: map[string]int64{}, log: lf, quit: make(chan struct{})}
	s.logf("Starting control daemon using socket %s (tessera fake)", sock)
	go func() {
		<-s.quit
		l.Close()
	}()
	if owner, err := strconv.Atoi(os.Getenv(envOwner)); err == nil && owner > 1 {
		go func() {
			for syscall.Kill(owner, 0) == nil {
				time.Sleep(500 * time.Millisecond)
			}
			s.mu.Lock()
			if !s.stopped {
				s.stopped = true
				close(s.quit)
			}
			s.mu.Unlock()
		}()
	}
	for {
		c, err := l.Accept()
		if err != nil {
			break
		}
		line, _ := bufio.NewReader(c).ReadString('\n')
		fmt.Fprint(c, s.do(strings.TrimSpace(line)))
		c.Close()
	}
	_ = os.Remove(sock)
	_ = os.Remove(filepath.Join(pipe, "control.pid"))
	s.logf("Exit with status 0")
	return 0
}

func (s *state) logf(format string, args ...any) {
	fmt.Fprintf(s.log, "[%s Control %d] %s\n", time.Now().Format("2006-01-02 15:04:05.000"), os.Getpid(), fmt.Sprintf(format, args...))
}

// do answers one command as the real daemon does.
func (s *state) do(cmd string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := strings.Fields(cmd)
	if len(f) == 0 {
		return "" // a probe: connected and closed
	}
	s.logf("Cmd:%s", cmd)
	switch f[0] {
	case "get_default_active_thread_percentage":
		return fmt.Sprintf("%.1f\n", s.pct)
	case "set_default_active_thread_percentage":
		if len(f) == 2 {
			if v, err := strconv.ParseFloat(f[1], 64); err == nil && v > 0 && v <= 100 {
				s.pct = v
			} else {
				s.logf("Invalid percentage, expected between (0.0, 100.0]")
			}
		}
		return fmt.Sprintf("%.1f\n", s.pct)
	case "set_default_device_pinned_mem_limit":
		if len(f) == 3 {
			if v, ok := parse(f[2]); ok {
				s.pinned[f[1]] = v
			}
		}
		return ""
	case "get_default_device_pinned_mem_limit":
		if len(f) == 2 {
			if v, ok := s.pinned[f[1]]; ok {
				if v >= 1024 {
					return fmt.Sprintf("%dG\n", v/1024)
				}
				return fmt.Sprintf("%dM\n", v)
			}
		}
		return ""
	case "get_server_list", "set_default_client_priority":
		return ""
	case "set_active_thread_percentage", "set_device_pinned_mem_limit", "get_active_thread_percentage", "shutdown_server", "get_client_list":
		if len(f) >= 2 {
			return fmt.Sprintf("Server %s not found\n", f[1])
		}
		return ""
	case "ps":
		return "Server not found\n"
	case "quit":
		if !s.stopped {
			s.stopped = true
			close(s.quit)
		}
		return ""
	}
	return fmt.Sprintf("Unknown command %q\n", cmd)
}

func parse(v string) (int64, bool) {
	if len(v) < 2 {
		return 0, false
	}
	n, err := strconv.ParseInt(v[:len(v)-1], 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	switch v[len(v)-1] {
	case 'M':
		return n, true
	case 'G':
		return n * 1024, true
	}
	return 0, false
}
