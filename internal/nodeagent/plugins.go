package nodeagent

import (
	"context"
	"path/filepath"
	"time"

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

// Resources lists the resources the agent's plugins serve.
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
// configuration's policy, and stops the plugins of resources no longer
// offered (the kubelet then sees their devices go).
func (a *Agent) syncPlugins(cfg config.Node, offer Offer) {
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
		fresh := r == nil
		if fresh {
			r = a.newPluginLocked(res)
		}
		r.plugin.SetPolicy(pol)
		r.plugin.SetGPUs(gpus, cfg.Sharing)
		if fresh {
			// Started once it has its devices: the first ListAndWatch
			// already lists them.
			a.wg.Add(1)
			go func() {
				defer a.wg.Done()
				defer close(r.done)
				_ = r.plugin.Run(r.ctx)
			}()
		}
	}
	for res, r := range a.plugins {
		if _, ok := offer[res]; !ok {
			r.plugin.Withdraw(time.Second)
			r.cancel()
			<-r.done
			r.pr.Close()
			delete(a.plugins, res)
			if a.plugin == r.plugin {
				a.plugin = nil
			}
			a.logger.Info("Device plugin stopped: resource no longer offered", "resource", res)
		}
	}
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
	for res, r := range a.plugins {
		r.cancel()
		<-r.done
		r.pr.Close()
		delete(a.plugins, res)
	}
}
