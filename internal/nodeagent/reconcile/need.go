package reconcile

// Reclaim on refusal. The budget file is a snapshot, and memory no
// limiter counts takes room too, so the driver may refuse an allocation
// that is within a container's guarantee while containers bursting on the
// GPU hold memory past theirs. The container's limiter then writes what it
// needs to its need file (statedir.NeedFile, in its writable state
// directory; the limits file names it), and retries for a while. The
// agent polls the need files of the containers it served (ServeNeeds,
// every Options.NeedPoll) and, for a new request:
//
//   - takes nothing from the file but the GPU and the size: the container
//     may write anything there;
//   - checks it against its own ledger and NVML: the container was granted
//     memory on that GPU (a shared grant of its own, limited), and NVML
//     says it holds less than its guarantee there; the request is capped
//     at what is left of the guarantee;
//   - answers at most one request per container per Options.NeedInterval;
//   - then runs the budget part of a pass (burst), which also stops the
//     borrowers, furthest above its guarantee first, until the GPU's free
//     memory (its memory less what NVML lists every process holding)
//     covers the capped request.
//
// So a container can make the agent stop others only while it is within
// its own guarantee and the GPU lacks the memory that guarantee promises;
// only containers above their guarantees are stopped, as MPS evicts only
// clients above their soft limit.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// Need is what a container's limiter asks for in its need file.
type Need struct {
	// GPU is the UUID of the GPU where the driver refused the allocation.
	GPU string
	// Bytes is the size of the refused allocation.
	Bytes uint64
}

// maxNeedFile bounds what the agent reads of a need file.
const maxNeedFile = 512

// ParseNeed parses a need file as the limiter writes it
// (limiter/src/tl_account.c):
//
//	version=1
//	device=GPU-6a1f2b3c-0d4e-5f60-7182-93a4b5c6d7e8
//	bytes=1073741824
//	used=3221225472
//
// device and bytes are required; other keys (used: what the container's
// limiter had charged, for the log) are ignored.
func ParseNeed(b []byte) (Need, error) {
	var n Need
	if len(b) > maxNeedFile {
		return n, fmt.Errorf("%d bytes exceed the limit of %d", len(b), maxNeedFile)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) == 0 || lines[0] != "version=1" {
		return n, errors.New("the first line must be version=1")
	}
	seen := map[string]bool{}
	for i, l := range lines[1:] {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return n, fmt.Errorf("line %d: want key=value", i+2)
		}
		if seen[k] {
			return n, fmt.Errorf("line %d: %s given twice", i+2, k)
		}
		seen[k] = true
		switch k {
		case "device":
			if !isGPUUUID(v) {
				return n, fmt.Errorf("line %d: device=%q: want a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)", i+2, v)
			}
			n.GPU = v
		case "bytes":
			u, err := strconv.ParseUint(v, 10, 64)
			if err != nil || u == 0 {
				return n, fmt.Errorf("line %d: bytes=%q: want a positive integer", i+2, v)
			}
			n.Bytes = u
		}
	}
	if n.GPU == "" || n.Bytes == 0 {
		return n, errors.New("device= and bytes= are required")
	}
	return n, nil
}

// isGPUUUID: GPU- or MIG- and 8-4-4-4-12 hexadecimal digits.
func isGPUUUID(s string) bool {
	if len(s) != 40 || (!strings.HasPrefix(s, "GPU-") && !strings.HasPrefix(s, "MIG-")) {
		return false
	}
	for i, c := range s[4:] {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
				return false
			}
		}
	}
	return true
}

// readNeed reads a need file the container may have replaced with
// anything: a regular file only (no link followed, no FIFO waited on),
// at most maxNeedFile bytes.
func readNeed(path string) (Need, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return Need{}, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return Need{}, err
	} else if !fi.Mode().IsRegular() {
		return Need{}, fmt.Errorf("not a regular file (%s)", fi.Mode().Type())
	}
	var b bytes.Buffer
	if _, err := io.Copy(&b, io.LimitReader(f, maxNeedFile+1)); err != nil {
		return Need{}, err
	}
	return ParseNeed(b.Bytes())
}

// needSource is a container whose need file the agent watches.
type needSource struct {
	pod       types.UID
	container string
	path      string
}

// needStamp tells one version of a need file from the next (the limiter
// replaces it whole, so each request is a new inode).
type needStamp struct {
	ino, size int64
	mtime     int64
}

func stampOf(fi os.FileInfo) needStamp {
	st := needStamp{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if s, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = int64(s.Ino)
	}
	return st
}

// ServeNeeds answers the new requests in the need files of the
// containers the agent served (the ledger as the last pass or admission
// read it). Run calls it every Options.NeedPoll; on a node where no grant
// may burst it reads nothing.
func (r *Reconciler) ServeNeeds() {
	if r.opts.BudgetDir == "" || (r.opts.Shared != nil && !r.opts.Shared()) {
		return
	}
	r.needMu.Lock()
	defer r.needMu.Unlock()
	r.mu.Lock()
	srcs := r.needSources
	r.mu.Unlock()
	live := map[string]bool{}
	for _, s := range srcs {
		live[s.path] = true
		fi, err := os.Lstat(s.path)
		if err != nil {
			delete(r.needSeen, s.path)
			continue
		}
		st := stampOf(fi)
		if old, ok := r.needSeen[s.path]; ok && old == st {
			continue
		}
		r.needSeen[s.path] = st
		id := string(s.pod) + "/" + s.container
		if last, ok := r.needServed[id]; ok && time.Since(last) < r.opts.NeedInterval {
			continue // the limiter asks again while it waits
		}
		n, err := readNeed(s.path)
		if err != nil {
			r.logger.V(2).Info("Ignoring a container's need file", "podUID", s.pod, "container", s.container, "err", err)
			continue
		}
		r.needServed[id] = time.Now()
		r.refused(s, n)
	}
	for p := range r.needSeen {
		if !live[p] {
			delete(r.needSeen, p)
		}
	}
	for id, t := range r.needServed {
		if time.Since(t) >= r.opts.NeedInterval {
			delete(r.needServed, id)
		}
	}
}

// refused answers one request: checked against the ledger and NVML, then
// the budget part of a pass with the request's shortfall.
func (r *Reconciler) refused(s needSource, n Need) {
	r.pass.Lock()
	defer r.pass.Unlock()
	o, ok := r.observe()
	if !ok {
		return
	}
	pod := o.pods[s.pod]
	if pod == nil || pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		return
	}
	var gpu *GPU
	for i := range r.gpus {
		if strings.EqualFold(r.gpus[i].UUID, n.GPU) { // the limiter writes the hex digits in lower case
			gpu = &r.gpus[i]
			n.GPU = gpu.UUID
		}
	}
	logger := r.logger.WithValues("pod", klog.KObj(pod), "container", s.container, "gpu", n.GPU, "bytes", n.Bytes)
	l, granted := o.grants[key{s.pod, s.container, ""}][n.GPU]
	if !granted || gpu == nil || l.exclusive || !l.limited || l.group != "" {
		logger.V(2).Info("Ignoring a need file: the container has no limited grant of its own on the GPU")
		return
	}
	used := o.used[key{s.pod, s.container, n.GPU}]
	room := l.mib - used
	if room <= 0 {
		logger.V(2).Info("Ignoring a need file: the container holds its guarantee already", "usedMiB", used, "guaranteeMiB", l.mib)
		return
	}
	want := min(int64((n.Bytes+1<<20-1)>>20), room)
	free := gpu.MemoryMiB - o.gpuUsed[n.GPU]
	short := max(0, want-free)
	logger.Info("The driver refused GPU memory to a container within its guarantee; reclaiming memory borrowed past other guarantees",
		"usedMiB", used, "guaranteeMiB", l.mib, "freeMiB", free, "shortMiB", short)
	r.burst(o, TriggerRefusal, &shortfall{gpu: n.GPU, mib: short})
}
