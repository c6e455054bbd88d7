package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/tessera-gpu/tessera/internal/atomicfile"
	"github.com/tessera-gpu/tessera/internal/nodeagent/config"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/kubeletshim"
)

// pluginRun is one resource's device plugin and what stops it.
type pluginRun struct {
	plugin *deviceplugin.Plugin
	pr     *deviceplugin.PodResources
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// PluginFor returns the device plugin serving a resource (nil if none).
func (a *Agent) PluginFor(resource string) *deviceplugin.Plugin {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r := a.plugins[resource]; r != nil {
		return r.plugin
	}
	return nil
}

// Resources lists the resources the agent offers (not the withdrawn ones
// whose plugins serve an empty list to the kubelet shim).
func (a *Agent) Resources() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.plugins))
	for r := range a.plugins {
		out = append(out, r)
	}
	return out
}

// syncPlugins runs one device plugin per resource of the offer (the GPU
// resource, its shared rename, MIG profiles) with its devices and the
// configuration's policy, and withdraws the plugins of resources no longer
// offered, so that the kubelet sees their devices go.
//
// Registered with the kubelet directly, a withdrawn plugin stops: the
// kubelet's device manager marks a disconnected resource's devices
// unhealthy itself. Behind the kubelet shim it keeps serving an empty
// list instead: the shim keeps reporting the last list it got while the
// agent is away, so a stopped plugin whose empty list the shim had not
// received (its stream reconnecting, or the list still queued when the
// server stopped) would leave the kubelet offering the old devices until
// the shim's StaleAfter. A re-offered resource's plugin resumes. The
// resources served are written to the socket directory (offeredFile), so
// that an agent restarted with fewer resources (the MIG label changed
// while it was down) withdraws the others the same way, at its first
// offer made from the Node's configuration (configured: the Node was
// read and its configuration applied; an offer from the defaults
// withdraws nothing of the record). Withdrawn resources are not
// forgotten: they stay registered, at 0, until the socket directory is
// cleared.
func (a *Agent) syncPlugins(cfg config.Node, offer Offer, configured bool) {
	if a.opts.NoPlugin || a.runCtx == nil {
		return
	}
	pol := deviceplugin.Policy{FailRequestsGreaterThanOne: cfg.FailRequestsGreaterThanOne, MIG: a}
	if a.mps != nil {
		pol.MPS = &deviceplugin.MPS{PipeDir: a.mps.PipeDir, SlotPercent: 100 / max(cfg.SharesPerGPU, 1)}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for res, gpus := range offer {
		r := a.plugins[res]
		if r == nil && a.withdrawn[res] != nil {
			r = a.withdrawn[res]
			delete(a.withdrawn, res)
			a.plugins[res] = r
			if res == a.opts.Resource {
				a.plugin = r.plugin
			}
			a.logger.Info("Device plugin resumed: resource offered again", "resource", res)
		}
		fresh := r == nil
		if fresh {
			r = a.newPluginLocked(res)
		}
		r.plugin.SetPolicy(pol)
		r.plugin.SetGPUs(gpus, cfg.Sharing)
		if fresh {
			// Started once it has its devices: the first ListAndWatch
			// already lists them.
			a.startPluginLocked(r)
		}
	}
	if a.opts.PluginSocketDir != "" && configured && !a.offeredRead {
		// The first offer after a start: what the previous agent served
		// and this one does not is withdrawn below, like a live change.
		a.offeredRead = true
		for _, res := range a.readOffered() {
			if _, ok := offer[res]; ok || a.plugins[res] != nil || a.withdrawn[res] != nil {
				continue
			}
			r := a.newPluginLocked(res)
			r.plugin.SetPolicy(pol)
			r.plugin.SetGPUs(nil, cfg.Sharing)
			a.startPluginLocked(r)
		}
	}
	for res, r := range a.plugins {
		if _, ok := offer[res]; !ok {
			delete(a.plugins, res)
			if a.plugin == r.plugin {
				a.plugin = nil
			}
			if a.opts.PluginSocketDir != "" {
				r.plugin.SetGPUs(nil, cfg.Sharing)
				a.withdrawn[res] = r
				a.logger.Info("Device plugin withdrawn: resource no longer offered; the kubelet shim is told it has no devices", "resource", res)
				continue
			}
			r.plugin.Withdraw(time.Second)
			r.cancel()
			<-r.done
			r.pr.Close()
			a.logger.Info("Device plugin stopped: resource no longer offered", "resource", res)
		}
	}
	if a.offeredRead { // not before: the previous agent's record is still to be read
		a.writeOfferedLocked()
	}
}

func (a *Agent) startPluginLocked(r *pluginRun) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer close(r.done)
		_ = r.plugin.Run(r.ctx)
	}()
}

// offeredFile, in the agent's socket directory, lists the resources the
// agent serves the kubelet shim (offered or withdrawn), one per line. The
// shim manager ignores it (not a socket).
const offeredFile = "tessera-resources"

// maxOffered bounds what readOffered takes from the file (a node offers
// its GPU resource, a shared rename and a few dozen MIG profiles), and
// maxOfferedBytes what it reads of it.
const (
	maxOffered      = 256
	maxOfferedBytes = 64 << 10
)

// readOffered is the resources a previous agent served under this agent's
// resource prefix; a missing or unreadable file is nothing (logged), a
// line that is not such a resource name is skipped (another prefix's
// resources are not this agent's to withdraw).
func (a *Agent) readOffered() []string {
	path := filepath.Join(a.opts.PluginSocketDir, offeredFile)
	b, err := readLimited(path, maxOfferedBytes)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			a.logger.Error(err, "Reading the resources the previous agent served; those it no longer offers stay with the kubelet shim until its --stale-after", "file", path)
		}
		return nil
	}
	var out []string
	skipped := 0
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		if len(out) == maxOffered {
			a.logger.Error(nil, "Too many resources in the file of served resources; the rest ignored", "file", path, "limit", maxOffered)
			break
		}
		// A qualified name (one "/", a DNS-subdomain prefix without "_")
		// under the agent's prefix: its socket name maps back to it.
		if !strings.HasPrefix(line, a.names.Prefix+"/") || len(validation.IsQualifiedName(line)) > 0 {
			if skipped++; skipped <= 3 {
				a.logger.Error(nil, "Ignoring a line of the file of served resources: not a resource name under the agent's prefix", "file", path, "line", fmt.Sprintf("%.80q", line), "prefix", a.names.Prefix)
			}
			continue
		}
		out = append(out, line)
	}
	return out
}

// readLimited reads at most limit bytes of a file.
func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, limit))
}

// writeOfferedLocked records the resources served (offered and withdrawn)
// when they change, replacing the file atomically.
func (a *Agent) writeOfferedLocked() {
	var all []string
	for _, m := range []map[string]*pluginRun{a.plugins, a.withdrawn} {
		for res := range m {
			all = append(all, res)
		}
	}
	sort.Strings(all)
	content := strings.Join(all, "\n") + "\n"
	if content == a.offeredWritten {
		return
	}
	path := filepath.Join(a.opts.PluginSocketDir, offeredFile)
	err := os.MkdirAll(a.opts.PluginSocketDir, 0o755)
	if err == nil {
		err = atomicfile.Write(path, []byte(content), 0o644)
	}
	if err != nil {
		a.logger.Error(err, "Recording the resources served for the next agent", "file", path)
		return
	}
	a.offeredWritten = content
}

func (a *Agent) newPluginLocked(res string) *pluginRun {
	pr := &deviceplugin.PodResources{Socket: a.opts.PodResourcesSocket, Resource: res}
	socket := ""
	if a.opts.PluginSocketDir != "" {
		socket = filepath.Join(a.opts.PluginSocketDir, kubeletshim.AgentSocketName(res))
	}
	p := deviceplugin.New(deviceplugin.Options{
		Resource:   res,
		PluginDir:  a.opts.PluginDir,
		Paths:      a.opts.Paths,
		Guard:      a.guardCfg,
		DeviceList: a.opts.DeviceList,
		Socket:     socket,
		Matcher: &deviceplugin.Matcher{
			Node: a.opts.NodeName, Resource: res,
			Kubelet: pr,
			Pods:    podGetter{lister: a.pods, client: a.client},
			State:   a.state,
		},
	}, a.logger.WithName("deviceplugin").WithValues("resource", res))
	ctx, cancel := context.WithCancel(a.runCtx)
	r := &pluginRun{plugin: p, pr: pr, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	a.plugins[res] = r
	if res == a.opts.Resource {
		a.plugin = p
	}
	return r
}

func (a *Agent) stopPlugins() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, m := range []map[string]*pluginRun{a.plugins, a.withdrawn} {
		for res, r := range m {
			r.cancel()
			<-r.done
			r.pr.Close()
			delete(m, res)
		}
	}
}
