package deviceplugin

// Driver-held memory limits (memlimits): where the node's driver
// partitions GPU memory per cgroup, a limited container's answer names a
// CDI device of its own whose edits run the memory-limits hook, which
// sets soft = guarantee and hard = ceiling on the container's group, and
// mounts the hook's confirmation read-only for the limiter.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdiparser "tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/internal/atomicfile"
	"github.com/tessera-gpu/tessera/internal/nodeagent/memlimits"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// DriverLimits has the driver hold the memory limits of containers whose
// GPUs it partitions.
type DriverLimits struct {
	// Hook is the memory-limits hook's command line on the host (the
	// program, then its leading arguments: `tessera memory-limits`).
	Hook []string
	// HookEnv is the hook's environment ("K=V"; none by default).
	HookEnv []string
	// CDIDir is where the container runtime reads CDI specs.
	CDIDir string
	// Partitions reports whether the driver partitions the GPU's memory
	// (memlimits.Detect).
	Partitions func(uuid string) bool
}

// HookTimeout bounds the hook's run (seconds): the runtime fails the
// container when it runs longer.
const HookTimeout = 10

// driverGrants are the grants the driver is to hold for a container: its
// shared (not exclusive, not MIG) GPUs, soft = the guarantee, hard = the
// ceiling (the guarantee when none). None unless the driver partitions
// every one of them (Partitioned).
func (d *DriverLimits) driverGrants(c api.ContainerAllocation) []memlimits.Grant {
	if d == nil {
		return nil
	}
	var out []memlimits.Grant
	for _, g := range c.Devices {
		if g.Exclusive {
			continue
		}
		if g.MIG != nil {
			return nil
		}
		out = append(out, Grant(g.UUID, g.MemoryMiB, g.CeilingMiB))
	}
	return d.Partitioned(out)
}

// Grant is the driver's limits of a grant guaranteed memoryMiB with a
// ceiling of ceilingMiB (0 or below the guarantee: none): soft = the
// guarantee, hard = the ceiling, else the guarantee.
func Grant(uuid string, memoryMiB, ceilingMiB int64) memlimits.Grant {
	return memlimits.Grant{UUID: uuid, SoftMiB: uint64(max(memoryMiB, 0)), HardMiB: uint64(max(memoryMiB, ceilingMiB, 0))}
}

// Partitioned returns the grants when the driver partitions the memory
// of every one of their GPUs and each limits some memory, else none: the
// limiter keeps a container's memory whole or not at all.
func (d *DriverLimits) Partitioned(gs []memlimits.Grant) []memlimits.Grant {
	if d == nil || d.Partitions == nil {
		return nil
	}
	for _, g := range gs {
		if g.SoftMiB == 0 || !d.Partitions(g.UUID) {
			return nil
		}
	}
	return gs
}

// cdiDeviceName is the container's device of kind api.CDIKindMemoryLimits.
func cdiDeviceName(uid types.UID, container string) string { return string(uid) + "_" + container }

// specName is the file of the container's CDI spec in CDIDir.
func (d *DriverLimits) specName(uid types.UID, container string) string {
	vendor, class := cdiparser.ParseQualifier(api.CDIKindMemoryLimits)
	return cdiapi.GenerateTransientSpecName(vendor, class, cdiDeviceName(uid, container)) + ".json"
}

// Hooks are the OCI hooks that set the grants' limits on the container's
// group when it is created (confirmed in confirm, a host path) and clear
// them when it stops.
func (d *DriverLimits) Hooks(confirm string, grants []memlimits.Grant) []*cdispec.Hook {
	args := append(append([]string{filepath.Base(d.Hook[0])}, d.Hook[1:]...), "--confirm", confirm)
	for _, g := range grants {
		args = append(args, "--gpu", g.String())
	}
	release := append(append([]string{filepath.Base(d.Hook[0])}, d.Hook[1:]...), "--release", "--confirm", confirm)
	timeout := HookTimeout
	return []*cdispec.Hook{
		{HookName: "createContainer", Path: d.Hook[0], Args: args, Env: d.HookEnv, Timeout: &timeout},
		// A runtime that runs it before it removes the container's
		// group (runc removes it first: there the agent's
		// reconciler clears the limits when the group empties).
		{HookName: "poststop", Path: d.Hook[0], Args: release, Env: d.HookEnv, Timeout: &timeout},
	}
}

// ConfirmMount is the read-only mount of a confirmation file (a host
// path) where the limiter reads it.
func ConfirmMount(confirm string) *cdispec.Mount {
	return &cdispec.Mount{HostPath: confirm, ContainerPath: memlimits.ConfirmPath, Options: []string{"ro", "nosuid", "nodev", "bind"}}
}

// writeSpec writes the container's CDI spec: a createContainer hook that
// sets the limits and confirms them in confirm.
func (d *DriverLimits) writeSpec(uid types.UID, container, confirm string, grants []memlimits.Grant) (string, error) {
	spec := &cdispec.Spec{Kind: api.CDIKindMemoryLimits, Devices: []cdispec.Device{{
		Name:           cdiDeviceName(uid, container),
		ContainerEdits: cdispec.ContainerEdits{Hooks: d.Hooks(confirm, grants)},
	}}}
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return "", err
	}
	spec.Version = v
	if err := cdiparser.ValidateDeviceName(spec.Devices[0].Name); err != nil {
		return "", fmt.Errorf("CDI spec: %w", err)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(d.CDIDir, 0o755); err != nil {
		return "", err
	}
	if err := atomicfile.Write(filepath.Join(d.CDIDir, d.specName(uid, container)), b, 0o644); err != nil {
		return "", fmt.Errorf("writing the CDI spec: %w", err)
	}
	vendor, class := cdiparser.ParseQualifier(api.CDIKindMemoryLimits)
	return cdiparser.QualifiedName(vendor, class, cdiDeviceName(uid, container)), nil
}

// SpecOf is the pod UID and container of a spec file name specName
// wrote.
func (d *DriverLimits) SpecOf(name string) (uid, container string, ok bool) {
	vendor, class := cdiparser.ParseQualifier(api.CDIKindMemoryLimits)
	prefix := cdiapi.GenerateTransientSpecName(vendor, class, "")
	id, ok := strings.CutSuffix(strings.TrimPrefix(name, prefix), ".json")
	if !ok || !strings.HasPrefix(name, prefix) {
		return "", "", false
	}
	return strings.Cut(id, "_")
}

// RemoveSpec removes a container's CDI spec (its pod is gone).
func (d *DriverLimits) RemoveSpec(uid types.UID, container string) error {
	err := os.Remove(filepath.Join(d.CDIDir, d.specName(uid, container)))
	if os.IsNotExist(err) {
		return nil
	}
	return err
}

// addDriverLimits adds to a limited container's answer the CDI device
// that runs the hook and the read-only mount of its confirmation.
func addDriverLimits(r *pluginapi.ContainerAllocateResponse, device, confirm string) {
	r.CdiDevices = append(r.CdiDevices, &pluginapi.CDIDevice{Name: device})
	r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: memlimits.ConfirmPath, HostPath: confirm, ReadOnly: true})
}

// driverLimits adds the driver's limits to a limited container's answer
// when the driver partitions all its GPUs. What cannot be written leaves
// the answer as it was: the limiter enforces the container's memory.
func (p *Plugin) driverLimits(r *pluginapi.ContainerAllocateResponse, t *Target) {
	d := p.opts.DriverLimits
	grants := d.driverGrants(t.Grant)
	if len(grants) == 0 {
		return
	}
	st := p.opts.Matcher.State
	confirm, err := st.CreateConfirm(t.Pod.UID, t.Container)
	var device string
	if err == nil {
		device, err = d.writeSpec(t.Pod.UID, t.Container, confirm, grants)
	}
	if err != nil {
		p.logger.Error(err, "The driver's memory limits not set up; the limiter enforces the container's memory", "pod", klog.KObj(t.Pod), "container", t.Container)
		return
	}
	addDriverLimits(r, device, confirm)
	p.logger.V(2).Info("The driver holds the container's memory limits", "pod", klog.KObj(t.Pod), "container", t.Container, "cdiDevice", device, "grants", grants)
}
