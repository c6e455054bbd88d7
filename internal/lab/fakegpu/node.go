package fakegpu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sys/unix"
)

// Node is the GPUs of one emulated node: a state file per GPU in Dir,
// named by the GPU's UUID, and the driver socket beside them.
type Node struct {
	Dir     string
	sampler Sampler
}

// File is a GPU's state file.
func (n *Node) File(uuid string) string { return filepath.Join(n.Dir, uuid) }

// Socket is the driver socket, on which the fake driver in a container
// learns its process's host pid.
func (n *Node) Socket() string { return filepath.Join(n.Dir, DriverSocket) }

// DriverSocket is the driver socket's name, in the node's GPU directory
// and in a container's device directory alike.
const DriverSocket = "driver.sock"

// UsedBytes is the device memory the GPU's processes hold
// (nvmlemu.Usage).
func (n *Node) UsedBytes(uuid string) (uint64, error) { return UsedBytes(n.File(uuid)) }

// UsedBytes is the device memory held on the GPU whose state file is path.
func UsedBytes(path string) (uint64, error) {
	_, procs, err := Read(path)
	if err != nil {
		return 0, err
	}
	var used uint64
	for _, p := range procs {
		used += p.UsedBytes
	}
	return used, nil
}

// Processes are the GPU's processes by host pid, with the memory each
// holds (nvmlemu.Usage).
func (n *Node) Processes(uuid string) ([]nvml.ProcessInfo, error) {
	_, procs, err := Read(n.File(uuid))
	if err != nil {
		return nil, err
	}
	out := make([]nvml.ProcessInfo, 0, len(procs))
	for _, p := range procs {
		out = append(out, nvml.ProcessInfo{Pid: p.HostPID, UsedGpuMemory: p.UsedBytes, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF})
	}
	return out, nil
}

// Utilization is the GPU's SM utilisation and each process's since the
// previous call (nvmlemu.Usage).
func (n *Node) Utilization(uuid string) (uint32, []nvml.ProcessUtilizationSample, error) {
	path := n.File(uuid)
	_, procs, err := Read(path)
	if err != nil {
		return 0, nil, err
	}
	now := MonotonicNs()
	gpu, per := n.sampler.Utilization(path, procs, now)
	stamp := uint64(time.Now().UnixMicro())
	out := make([]nvml.ProcessUtilizationSample, 0, len(per))
	for pid, u := range per {
		out = append(out, nvml.ProcessUtilizationSample{Pid: pid, TimeStamp: stamp, SmUtil: u})
	}
	return gpu, out, nil
}

// ListenDriver listens on the driver socket; ServeDriver answers on it.
func (n *Node) ListenDriver() (*net.UnixListener, error) {
	path := n.Socket()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("fake GPU driver socket: %w", err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// ServeDriver answers every connection to the driver socket with the
// connecting process's host pid (from the connection's credentials, which
// the kernel gives in the reader's PID namespace), until ctx ends.
func ServeDriver(ctx context.Context, l *net.UnixListener) error {
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go answerPID(c)
	}
}

func answerPID(c *net.UnixConn) {
	defer c.Close()
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	var cred *unix.Ucred
	_ = raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err != nil || cred == nil {
		return
	}
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = fmt.Fprintf(c, "%d\n", cred.Pid)
}

// SetLimits is SetLimits on the GPU's state file (nvmlemu.Limits).
func (n *Node) SetLimits(uuid, dir string, soft, hard uint64) error {
	return SetLimits(n.File(uuid), dir, soft, hard)
}

// GetLimits is GetLimits on the GPU's state file (nvmlemu.Limits).
func (n *Node) GetLimits(uuid, dir string) (soft, hard, used uint64, err error) {
	return GetLimits(n.File(uuid), dir)
}

// NVMLCodes are NVML's return codes of SetLimits' and GetLimits' errors.
var NVMLCodes = map[error]nvml.Return{
	ErrNotSupported: nvml.ERROR_NOT_SUPPORTED, ErrInvalid: nvml.ERROR_INVALID_ARGUMENT,
	ErrNoPermission: nvml.ERROR_NO_PERMISSION, ErrCgroup: nvml.ERROR_OPERATING_SYSTEM,
	ErrNotFound: nvml.ERROR_NOT_FOUND, ErrTableFull: nvml.ERROR_UNKNOWN,
}
