package config

import (
	"fmt"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// nvidiaConfig is NVIDIA's k8s-device-plugin config file, version v1, as
// its users write it. Every field is decoded strictly (an unknown field is
// an error naming it) and then sorted into three kinds, each checked in
// parseNVIDIA:
//
//   - implemented: the field changes what a container gets and Tessera
//     does what NVIDIA's plugin would (migStrategy, mpsRoot, time-slicing
//     and MPS sharing with renameByDefault, failRequestsGreaterThanOne,
//     replicas, rename to <name>.shared);
//   - refused: the field would change what a container gets in a way
//     Tessera does not implement; the error names the field and the
//     profile does not apply (the last good one stays);
//   - logged: the field only tunes NVIDIA's own plugin (its driver root,
//     its init behaviour, GPU feature discovery); it is accepted and
//     reported in Node.Notes, which the agent logs.
type nvidiaConfig struct {
	Version   string           `json:"version"`
	Flags     *nvidiaFlags     `json:"flags,omitempty"`
	Resources *nvidiaResources `json:"resources,omitempty"`
	Sharing   *nvidiaSharing   `json:"sharing,omitempty"`
	IMEX      *nvidiaIMEX      `json:"imex,omitempty"`
}

type nvidiaFlags struct {
	MigStrategy             *string           `json:"migStrategy,omitempty"`
	FailOnInitError         *bool             `json:"failOnInitError,omitempty"`
	MpsRoot                 *string           `json:"mpsRoot,omitempty"`
	NvidiaDriverRoot        *string           `json:"nvidiaDriverRoot,omitempty"`
	DriverRoot              *string           `json:"driverRoot,omitempty"`
	NvidiaDevRoot           *string           `json:"nvidiaDevRoot,omitempty"`
	DevRoot                 *string           `json:"devRoot,omitempty"`
	GDSEnabled              *bool             `json:"gdsEnabled,omitempty"`
	MOFEDEnabled            *bool             `json:"mofedEnabled,omitempty"`
	UseNodeFeatureAPI       *bool             `json:"useNodeFeatureAPI,omitempty"`
	DeviceDiscoveryStrategy *string           `json:"deviceDiscoveryStrategy,omitempty"`
	Plugin                  *nvidiaPluginFlag `json:"plugin,omitempty"`
	GFD                     map[string]any    `json:"gfd,omitempty"`
}

type nvidiaPluginFlag struct {
	PassDeviceSpecs     *bool   `json:"passDeviceSpecs,omitempty"`
	DeviceListStrategy  any     `json:"deviceListStrategy,omitempty"`
	DeviceIDStrategy    *string `json:"deviceIDStrategy,omitempty"`
	CDIAnnotationPrefix *string `json:"cdiAnnotationPrefix,omitempty"`
	NvidiaCTKPath       *string `json:"nvidiaCTKPath,omitempty"`
	ContainerDriverRoot *string `json:"containerDriverRoot,omitempty"`
}

type nvidiaResources struct {
	GPUs []map[string]any `json:"gpus,omitempty"`
	MIG  []map[string]any `json:"mig,omitempty"`
}

type nvidiaSharing struct {
	TimeSlicing *nvidiaReplicated `json:"timeSlicing,omitempty"`
	MPS         *nvidiaReplicated `json:"mps,omitempty"`
}

type nvidiaReplicated struct {
	RenameByDefault            bool                `json:"renameByDefault,omitempty"`
	FailRequestsGreaterThanOne bool                `json:"failRequestsGreaterThanOne,omitempty"`
	Resources                  []nvidiaReplicatedR `json:"resources"`
}

type nvidiaReplicatedR struct {
	Name     string `json:"name"`
	Rename   string `json:"rename,omitempty"`
	Devices  any    `json:"devices,omitempty"`
	Replicas int    `json:"replicas"`
}

type nvidiaIMEX struct {
	ChannelIDs []int `json:"channelIDs,omitempty"`
	Required   bool  `json:"required,omitempty"`
}

// parseNVIDIA reads NVIDIA's device-plugin config. resource is the GPU
// resource the agent serves (names.GPU).
func parseNVIDIA(data []byte, names api.ResourceNames) (Node, error) {
	var n nvidiaConfig
	if err := yaml.UnmarshalStrict(data, &n); err != nil {
		return Node{}, fmt.Errorf("NVIDIA device-plugin config: %w", err)
	}
	if n.Version != "v1" {
		return Node{}, fmt.Errorf("NVIDIA device-plugin config: version %q is not supported (want \"v1\")", n.Version)
	}
	out := Node{NodeConfig: api.NodeConfig{Sharing: api.SharingExclusive, SharesPerGPU: 1}}
	note := func(field string, v any, why string) {
		out.Notes = append(out.Notes, fmt.Sprintf("%s=%v accepted and not used: %s", field, v, why))
	}
	strategy := api.MIGStrategyNone
	if f := n.Flags; f != nil {
		if f.MigStrategy != nil {
			strategy = api.MIGStrategy(*f.MigStrategy)
			if strategy == "" || !strategy.Valid() {
				return Node{}, fmt.Errorf("flags.migStrategy %q is not one of %q, %q, %q", *f.MigStrategy, api.MIGStrategyNone, api.MIGStrategySingle, api.MIGStrategyMixed)
			}
		}
		if f.MpsRoot != nil {
			if !strings.HasPrefix(*f.MpsRoot, "/") {
				return Node{}, fmt.Errorf("flags.mpsRoot %q: want an absolute path on the host", *f.MpsRoot)
			}
			out.MPSRoot = *f.MpsRoot
		}
		for field, v := range map[string]*bool{"flags.gdsEnabled": f.GDSEnabled, "flags.mofedEnabled": f.MOFEDEnabled} {
			if v != nil && *v {
				return Node{}, fmt.Errorf("%s=true is not supported: Tessera does not mount the GPUDirect Storage or MOFED devices into containers (remove the field or set it false)", field)
			}
		}
		if v := f.FailOnInitError; v != nil {
			note("flags.failOnInitError", *v, "the node agent always reports a GPU it cannot read and serves the others")
		}
		for field, v := range map[string]*string{
			"flags.nvidiaDriverRoot": f.NvidiaDriverRoot, "flags.driverRoot": f.DriverRoot,
			"flags.nvidiaDevRoot": f.NvidiaDevRoot, "flags.devRoot": f.DevRoot,
			"flags.deviceDiscoveryStrategy": f.DeviceDiscoveryStrategy,
		} {
			if v != nil {
				note(field, *v, "the node agent finds NVML itself and the container toolkit mounts the driver")
			}
		}
		if v := f.UseNodeFeatureAPI; v != nil {
			note("flags.useNodeFeatureAPI", *v, "GPU feature discovery is not part of Tessera")
		}
		if len(f.GFD) > 0 {
			note("flags.gfd", keysOf(f.GFD), "GPU feature discovery is not part of Tessera")
		}
		if p := f.Plugin; p != nil {
			if v := p.PassDeviceSpecs; v != nil && *v {
				return Node{}, fmt.Errorf("flags.plugin.passDeviceSpecs=true is not supported: Tessera names the devices in NVIDIA_VISIBLE_DEVICES and the container toolkit creates the device nodes")
			}
			if v := p.DeviceListStrategy; v != nil {
				list := []string{}
				switch s := v.(type) {
				case string:
					list = append(list, s)
				case []any:
					for _, e := range s {
						list = append(list, fmt.Sprint(e))
					}
				}
				if len(list) != 1 || list[0] != "envvar" {
					return Node{}, fmt.Errorf("flags.plugin.deviceListStrategy %v is not supported: Tessera passes devices as the NVIDIA_VISIBLE_DEVICES environment variable (\"envvar\")", v)
				}
			}
			if v := p.DeviceIDStrategy; v != nil && *v != "uuid" {
				return Node{}, fmt.Errorf("flags.plugin.deviceIDStrategy %q is not supported: Tessera names devices by UUID (\"uuid\")", *v)
			}
			for field, v := range map[string]*string{
				"flags.plugin.cdiAnnotationPrefix": p.CDIAnnotationPrefix, "flags.plugin.nvidiaCTKPath": p.NvidiaCTKPath,
				"flags.plugin.containerDriverRoot": p.ContainerDriverRoot,
			} {
				if v != nil {
					note(field, *v, "only NVIDIA's plugin uses it")
				}
			}
		}
	}
	if r := n.Resources; r != nil && (len(r.GPUs) > 0 || len(r.MIG) > 0) {
		return Node{}, fmt.Errorf("resources.gpus / resources.mig (renaming resources by GPU model) is not supported: the scheduler and webhook must know every resource name cluster-wide; select GPU models with the tessera.io/use-gputype annotation")
	}
	if im := n.IMEX; im != nil && (len(im.ChannelIDs) > 0 || im.Required) {
		return Node{}, fmt.Errorf("imex.channelIDs / imex.required is not supported: Tessera does not inject IMEX channels")
	}
	var ts, mps *nvidiaReplicated
	if n.Sharing != nil {
		ts, mps = n.Sharing.TimeSlicing, n.Sharing.MPS
	}
	if ts != nil && mps != nil && len(ts.Resources) > 0 && len(mps.Resources) > 0 {
		return Node{}, fmt.Errorf("sharing.timeSlicing and sharing.mps are both set; a node shares its GPUs one way")
	}
	switch {
	case mps != nil && len(mps.Resources) > 0:
		if strategy != api.MIGStrategyNone {
			return Node{}, fmt.Errorf("sharing.mps with flags.migStrategy %q: MPS on MIG devices is not supported (use MPS on whole GPUs or MIG without MPS)", strategy)
		}
		if err := replicated("sharing.mps", mps, names, &out.NodeConfig); err != nil {
			return Node{}, err
		}
		out.Sharing = api.SharingMPS
		if out.SharesPerGPU > api.MaxMPSClients {
			return Node{}, fmt.Errorf("sharing.mps.resources: replicas %d exceed the %d clients MPS serves per GPU", out.SharesPerGPU, api.MaxMPSClients)
		}
	case ts != nil && len(ts.Resources) > 0:
		if strategy != api.MIGStrategyNone {
			return Node{}, fmt.Errorf("sharing.timeSlicing with flags.migStrategy %q: time-slicing MIG devices is not supported", strategy)
		}
		if err := replicated("sharing.timeSlicing", ts, names, &out.NodeConfig); err != nil {
			return Node{}, err
		}
		out.Sharing = api.SharingTimeSlicing
	case strategy != api.MIGStrategyNone:
		// MIG devices, whole: NVIDIA's plugin with a MIG strategy.
		out.Sharing, out.SharesPerGPU, out.MIGStrategy = api.SharingMIG, 1, strategy
	}
	return out, nil
}

// replicated applies a sharing.timeSlicing or sharing.mps section.
func replicated(field string, r *nvidiaReplicated, names api.ResourceNames, c *api.NodeConfig) error {
	var seen []string
	found := false
	for i, res := range r.Resources {
		ref := fmt.Sprintf("%s.resources[%d]", field, i)
		seen = append(seen, res.Name)
		if res.Name != names.GPU {
			if _, ok := names.MIGProfileOf(res.Name); ok {
				return fmt.Errorf("%s.name %q: sharing MIG devices is not supported (share whole GPUs, or give each container its own MIG device)", ref, res.Name)
			}
			return fmt.Errorf("%s.name %q: the agent serves %q; sharing another resource is not supported", ref, res.Name, names.GPU)
		}
		if found {
			return fmt.Errorf("%s: %q listed twice", ref, res.Name)
		}
		found = true
		if res.Devices != nil && res.Devices != "all" {
			return fmt.Errorf("%s.devices %v: only \"all\" is supported (exclude GPUs with a Tessera profile's excludeGPUs)", ref, res.Devices)
		}
		switch res.Rename {
		case "":
			c.RenameShared = r.RenameByDefault
		case names.Shared(names.GPU):
			c.RenameShared = true
		default:
			return fmt.Errorf("%s.rename %q: only %q (what renameByDefault gives) is supported, since the scheduler and the webhook must know the name cluster-wide", ref, res.Rename, names.Shared(names.GPU))
		}
		if res.Replicas < 1 || res.Replicas > api.MaxSharesLimit {
			return fmt.Errorf("%s.replicas %d outside [1, %d]", ref, res.Replicas, api.MaxSharesLimit)
		}
		c.SharesPerGPU = res.Replicas
	}
	if !found {
		return fmt.Errorf("%s.resources names %q, none of them %q (the resource this agent serves)", field, seen, names.GPU)
	}
	c.FailRequestsGreaterThanOne = r.FailRequestsGreaterThanOne
	return nil
}

func keysOf(m map[string]any) string {
	k := make([]string, 0, len(m))
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return strings.Join(k, ",")
}
