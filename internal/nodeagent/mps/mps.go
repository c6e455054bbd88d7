// Package mps runs NVIDIA's MPS control daemon (nvidia-cuda-mps-control)
// per GPU for a node in mps mode: started with its own pipe and log
// directories and CUDA_VISIBLE_DEVICES set to the GPU, checked and started
// again when it died, and told the limits its servers give clients.
//
// What MPS enforces and what is the client's to keep (docs/mig-mps.md):
// a client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT can only lower what its server allows,
// and a client can unset them. The server's own values, set through the
// control daemon (set_default_* for servers to come, set_* for running
// ones), are the bound no client can lift; they are per client and the
// same for every client of the GPU, so the manager sets them to the
// largest share any client of the GPU holds. Smaller shares are then kept
// by the client's environment (cooperative) and, for memory, by the
// limiter's accounting (enforced).
package mps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// DefaultRoot is where the daemons' directories live on the host (one
// directory per GPU UUID, with pipe/ and log/).
const DefaultRoot = "/run/tessera/mps"

// Limits are the per-client bounds a GPU's MPS servers get.
type Limits struct {
	// ThreadPercent is the active thread percentage, 1..100.
	ThreadPercent int
	// PinnedMiB is the device pinned memory limit in MiB (0: none).
	PinnedMiB int64
}

// GPU is one GPU the manager runs a daemon for.
type GPU struct {
	UUID   string
	Limits Limits
}

// Manager runs the daemons.
type Manager struct {
	// Command runs nvidia-cuda-mps-control (path and leading arguments).
	Command []string
	// Root holds the per-GPU directories.
	Root   string
	Logger klog.Logger
	// Timeout bounds one control command (default 10s).
	Timeout time.Duration

	mu      sync.Mutex
	daemons map[string]*daemon
}

type daemon struct {
	uuid    string
	applied Limits
	starts  int
}

// PipeDir is the pipe directory of GPU uuid's daemon.
func (m *Manager) PipeDir(uuid string) string { return filepath.Join(m.Root, uuid, "pipe") }

// LogDir is the log directory of GPU uuid's daemon.
func (m *Manager) LogDir(uuid string) string { return filepath.Join(m.Root, uuid, "log") }

// Starts returns how many times the daemon of GPU uuid was started.
func (m *Manager) Starts(uuid string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d := m.daemons[uuid]; d != nil {
		return d.starts
	}
	return 0
}

// Ensure makes every listed GPU's daemon run with its limits (starting a
// daemon that is not running, restarting one that died) and quits the
// daemons of GPUs no longer listed. It returns the errors of the GPUs it
// could not bring to that state, joined; the others are done.
func (m *Manager) Ensure(ctx context.Context, gpus []GPU) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.daemons == nil {
		m.daemons = map[string]*daemon{}
	}
	want := map[string]bool{}
	var errs []error
	for _, g := range gpus {
		want[g.UUID] = true
		d := m.daemons[g.UUID]
		if d == nil {
			d = &daemon{uuid: g.UUID}
			m.daemons[g.UUID] = d
		}
		if err := m.ensure(ctx, d, g.Limits); err != nil {
			errs = append(errs, fmt.Errorf("GPU %s: %w", g.UUID, err))
		}
	}
	for uuid := range m.daemons {
		if !want[uuid] {
			if _, err := m.control(ctx, uuid, "quit"); err != nil && !errors.Is(err, ErrNoDaemon) {
				errs = append(errs, fmt.Errorf("GPU %s: quit: %w", uuid, err))
			}
			delete(m.daemons, uuid)
		}
	}
	return errors.Join(errs...)
}

// Stop quits every daemon.
func (m *Manager) Stop(ctx context.Context) error { return m.Ensure(ctx, nil) }

// ErrNoDaemon: no control daemon answers on the pipe directory.
var ErrNoDaemon = errors.New("no MPS control daemon")

func (m *Manager) ensure(ctx context.Context, d *daemon, l Limits) error {
	if _, err := m.control(ctx, d.uuid, "get_server_list"); err != nil {
		if !errors.Is(err, ErrNoDaemon) {
			return err
		}
		if d.starts > 0 {
			m.Logger.Info("MPS control daemon not running; starting it again", "gpu", d.uuid, "starts", d.starts)
		}
		if err := m.start(ctx, d.uuid); err != nil {
			return err
		}
		d.starts++
		d.applied = Limits{}
	}
	if d.applied == l {
		return nil
	}
	if err := m.setLimits(ctx, d.uuid, l); err != nil {
		return err
	}
	d.applied = l
	m.Logger.Info("MPS limits set", "gpu", d.uuid, "activeThreadPercentage", l.ThreadPercent, "pinnedMemoryMiB", l.PinnedMiB)
	return nil
}

func (m *Manager) env(uuid string) []string {
	return append(os.Environ(),
		"CUDA_VISIBLE_DEVICES="+uuid,
		"CUDA_MPS_PIPE_DIRECTORY="+m.PipeDir(uuid),
		"CUDA_MPS_LOG_DIRECTORY="+m.LogDir(uuid),
	)
}

func (m *Manager) timeout() time.Duration {
	if m.Timeout > 0 {
		return m.Timeout
	}
	return 10 * time.Second
}

// start runs `nvidia-cuda-mps-control -d`, which returns once the
// daemon listens.
func (m *Manager) start(ctx context.Context, uuid string) error {
	for _, dir := range []string{m.PipeDir(uuid), m.LogDir(uuid)} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, m.timeout())
	defer cancel()
	cmd := exec.CommandContext(ctx, m.Command[0], append(append([]string(nil), m.Command[1:]...), "-d")...)
	cmd.Env = m.env(uuid)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("starting the MPS control daemon (%s -d): %v: %s", m.Command[0], err, strings.TrimSpace(string(out)))
	}
	m.Logger.Info("MPS control daemon started", "gpu", uuid, "pipe", m.PipeDir(uuid))
	return nil
}

// control sends one command to GPU uuid's daemon and returns its answer.
// The real front end exits 0 whatever the daemon said (measured with
// driver 535's binary), so callers check answers, not the status; it
// exits non-zero when no daemon listens.
func (m *Manager) control(ctx context.Context, uuid, command string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.timeout())
	defer cancel()
	cmd := exec.CommandContext(ctx, m.Command[0], m.Command[1:]...)
	cmd.Env = m.env(uuid)
	cmd.Stdin = strings.NewReader(command + "\n")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	answer := strings.TrimSpace(out.String())
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return answer, fmt.Errorf("%w on %s: %s", ErrNoDaemon, m.PipeDir(uuid), answer)
		}
		return answer, fmt.Errorf("%s %q: %v", m.Command[0], command, err)
	}
	return answer, nil
}

// setLimits sets the defaults for servers to come and the values of the
// running servers, and checks the daemon took them.
func (m *Manager) setLimits(ctx context.Context, uuid string, l Limits) error {
	pct := strconv.Itoa(l.ThreadPercent)
	out, err := m.control(ctx, uuid, "set_default_active_thread_percentage "+pct)
	if err != nil {
		return err
	}
	if v, perr := strconv.ParseFloat(out, 64); perr != nil || int(v) != l.ThreadPercent {
		return fmt.Errorf("set_default_active_thread_percentage %s: the daemon answered %q", pct, out)
	}
	if l.PinnedMiB > 0 {
		limit := fmt.Sprintf("%dM", l.PinnedMiB)
		if _, err := m.control(ctx, uuid, "set_default_device_pinned_mem_limit 0 "+limit); err != nil {
			return err
		}
		got, err := m.control(ctx, uuid, "get_default_device_pinned_mem_limit 0")
		if err != nil {
			return err
		}
		// The daemon prints whole gibibytes once the limit reaches one
		// (1536M reads back as "1G"), so compare within 1 GiB.
		if mib, ok := parseMiB(got); !ok || mib > l.PinnedMiB || l.PinnedMiB-mib >= 1024 {
			return fmt.Errorf("set_default_device_pinned_mem_limit 0 %s: the daemon reads back %q", limit, got)
		}
	}
	servers, err := m.control(ctx, uuid, "get_server_list")
	if err != nil {
		return err
	}
	pids := strings.Fields(servers)
	sort.Strings(pids)
	for _, pid := range pids {
		if _, err := strconv.Atoi(pid); err != nil {
			continue
		}
		if _, err := m.control(ctx, uuid, "set_active_thread_percentage "+pid+" "+pct); err != nil {
			return err
		}
		if l.PinnedMiB > 0 {
			if _, err := m.control(ctx, uuid, fmt.Sprintf("set_device_pinned_mem_limit %s 0 %dM", pid, l.PinnedMiB)); err != nil {
				return err
			}
		}
	}
	return nil
}

// parseMiB reads "2G" or "512M" as MiB.
func parseMiB(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	if len(s) < 2 {
		return 0, false
	}
	n, err := strconv.ParseInt(s[:len(s)-1], 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	switch s[len(s)-1] {
	case 'G', 'g':
		return n * 1024, true
	case 'M', 'm':
		return n, true
	}
	return 0, false
}
