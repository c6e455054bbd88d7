package nodeagent

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/dra"
	"github.com/tessera-gpu/tessera/internal/nodeagent/memlimits"
	"github.com/tessera-gpu/tessera/internal/nodeagent/metrics"
	"github.com/tessera-gpu/tessera/internal/nodeagent/parts"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// newParts builds the agent's parts from its options, each given only
// what it needs, in the order they start and reconcile (they stop in
// reverse). This is the one place a mode is registered: a new mode is a
// parts.Part built here.
func (a *Agent) newParts(lib nvml.Interface) []parts.Part {
	o, logger := a.opts, a.logger
	state := statedir.Dirs{Root: o.Paths.StateRoot}
	volcano := parts.NewVolcano(parts.VolcanoOptions{NodeName: o.NodeName, Client: a.client, State: state, Devices: a.devices,
		DeviceConfig: o.VolcanoDeviceConfig, Logger: logger.WithName("volcano")})
	mig := parts.NewMIG(parts.MIGOptions{
		NodeName: o.NodeName, Devices: a.devices, Health: a.monitor.Snapshot, Client: a.client, Protocol: volcano.Record, Logger: logger,
	})
	mps := parts.NewMPS(parts.MPSOptions{NodeName: o.NodeName, Control: o.MPSControl, Root: o.MPSRoot, Logger: logger})
	list := []parts.Part{mig}
	var collectors []prometheus.Collector
	var claims func() []metrics.Claim
	if !o.NoPlugin {
		limits := a.driverLimits()
		var trust *parts.Trust
		driver := o.DRA
		// A claim just prepared has its guarantee made good (borrowed
		// memory reclaimed, the budget files written) before its
		// containers start, as a container the device plugin serves.
		driver.Admitted = func() {
			if g := trust.Guard(); g != nil && g.Admitted != nil {
				g.Admitted()
			}
		}
		driver.NodeName, driver.Client, driver.Names, driver.Paths = o.NodeName, a.client, a.names, o.Paths
		if limits != nil {
			driver.DriverLimits = limits
			driver.ReleaseConfirmed = func(confirm string) error { return memlimits.ReleaseConfirmed(lib, confirm) }
		}
		draPart := parts.NewDRA(parts.DRAOptions{Driver: driver, System: dra.ReadSystem(lib), Devices: a.devices, Logger: logger})
		rec := o.Reconcile
		if rec.Shared == nil {
			rec.Shared = func() bool {
				cfg, _ := a.config.Current()
				return cfg.Sharing == api.SharingShared
			}
		}
		if rec.Claims == nil {
			rec.Claims = draPart.Claims
		}
		if rec.Known == nil {
			rec.Known = draPart.ClaimsKnown
		}
		if rec.BudgetDir == "" {
			rec.BudgetDir = o.Paths.BudgetHost
		}
		trust = parts.NewTrust(parts.TrustOptions{
			Names: a.names, RecordKeys: o.RecordKeys, AcceptUnsigned: o.AcceptUnsigned, Client: a.client,
			Reconcile: rec, Devices: a.devices, State: state, Logger: logger,
		})
		plugins := parts.NewPlugins(parts.PluginsOptions{
			NodeName: o.NodeName, Names: a.names, Paths: o.Paths,
			PluginDir: o.PluginDir, PodResourcesSocket: o.PodResourcesSocket, DeviceList: o.DeviceList, SocketDir: o.PluginSocketDir,
			Guard: trust.Guard(), MIG: mig, MPSPipeDir: mps.PipeDir,
			Protocols:    map[string]deviceplugin.Protocol{api.VolcanoVGPUNumber: volcano},
			DriverLimits: limits,
			Client:       a.client, StateAge: 2 * o.Resync, Logger: logger,
		})
		list = append(list, trust, plugins, volcano, draPart)
		if limits != nil {
			list = append(list, parts.NewDriverLimits(parts.DriverLimitsOptions{
				Lib: lib, State: state, Limits: limits, Confirms: draPart.Confirms, Logger: logger.WithName("driver-limits"),
			}))
		}
		collectors, claims = trust.Collectors(), draPart.Claims
	}
	list = append(list, mps)
	collectors = append(collectors, metrics.Partitioning(o.NodeName, a.partitionsNow))
	if o.MetricsAddress != "" {
		list = append(list, parts.NewMetrics(parts.MetricsOptions{
			Address: o.MetricsAddress, NodeName: o.NodeName, Devices: a.devices, Health: a.monitor.Snapshot,
			State: state, Claims: claims, Collectors: collectors, Logger: logger,
		}))
	}
	return list
}

// part returns the agent's part of type T, if it has one.
func part[T parts.Part](a *Agent) (T, bool) {
	for _, p := range a.parts {
		if t, ok := p.(T); ok {
			return t, true
		}
	}
	var zero T
	return zero, false
}

// Plugin returns the device plugin of the GPU resource (nil when none
// serves it).
func (a *Agent) Plugin() *deviceplugin.Plugin { return a.PluginFor(a.opts.Resource) }

// PluginFor returns the device plugin serving a resource (nil if none).
func (a *Agent) PluginFor(resource string) *deviceplugin.Plugin {
	if p, ok := part[*parts.Plugins](a); ok {
		return p.Plugin(resource)
	}
	return nil
}

// Resources lists the resources the agent's device plugins offer.
func (a *Agent) Resources() []string {
	if p, ok := part[*parts.Plugins](a); ok {
		return p.Resources()
	}
	return nil
}

// MIGReports returns the last report of applying the MIG layout, per GPU.
func (a *Agent) MIGReports() map[string]string {
	p, _ := part[*parts.MIG](a)
	return p.Reports()
}

// DRADriver returns the DRA driver (nil before the node first turned to
// mode dra).
func (a *Agent) DRADriver() *dra.Driver {
	if p, ok := part[*parts.DRA](a); ok {
		return p.Driver()
	}
	return nil
}

// MetricsAddr is the address the metrics server listens on ("" when it
// does not run).
func (a *Agent) MetricsAddr() string {
	if p, ok := part[*parts.Metrics](a); ok {
		return p.Addr()
	}
	return ""
}

// driverLimits is the device plugins' DriverLimits: the agent's options
// with the GPUs whose driver partitions memory (found at start); nil when
// the options set none or no GPU's driver partitions.
func (a *Agent) driverLimits() *deviceplugin.DriverLimits {
	o := a.opts.DriverLimits
	if o == nil || len(o.Hook) == 0 {
		return nil
	}
	any := false
	for _, s := range a.partitioning {
		any = any || s.OK
	}
	if !any {
		return nil
	}
	l := *o
	l.Partitions = func(uuid string) bool { return a.partitionsNow()[uuid] }
	return &l
}
