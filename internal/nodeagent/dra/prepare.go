package dra

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdiparser "tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/internal/atomicfile"
	"github.com/tessera-gpu/tessera/internal/limiterconf"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/nodeagent/memlimits"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Names inside a request's directory (<claim root>/<claim UID>/<request>).
const (
	stateName  = "state"
	limitsName = "limiter.conf"
	// confirmName is the driver-held limits' confirmation
	// (memlimits.ConfirmPath in the container).
	confirmName = "driver-memory"
	// stateFile is the limiter's shared-state file inside the state
	// directory, as the container sees it.
	stateFile = "cache"
)

// cdiVendor and cdiClass make up api.CDIKind.
var cdiVendor, cdiClass, _ = strings.Cut(api.CDIKind, "/")

// checkFit checks that the grants fit their GPUs beside every other
// prepared claim: memory, cores and the share count of each GPU, a GPU
// allocated whole alone, and healthy GPUs unless the claim tolerates the
// taint. Any scheduler can allocate claims; this is the node's last word.
func checkFit(uid types.UID, gs []Grant, tolerated map[string]bool, prepared map[types.UID]*Prepared, gpus map[string]GPU) error {
	type use struct {
		mem, cores int64
		shares     int
		whole      []string // claims holding it whole
		holders    []string
	}
	usage := map[string]*use{}
	add := func(owner string, g Grant) {
		if g.Admin {
			return
		}
		u := usage[g.Device]
		if u == nil {
			u = &use{}
			usage[g.Device] = u
		}
		u.mem += g.MemoryMiB
		u.cores += g.Cores
		u.shares++
		u.holders = append(u.holders, owner)
		if g.Whole {
			u.whole = append(u.whole, owner)
		}
	}
	for id, p := range prepared {
		if id == uid {
			continue
		}
		for _, g := range p.Grants {
			add(p.Namespace+"/"+p.Name, g)
		}
	}
	for _, g := range gs {
		gpu := gpus[g.Device]
		if gpu.Health != api.Healthy && !tolerated[g.Device] {
			return fmt.Errorf("GPU %s (%s) is unhealthy (%s); the claim was allocated before it failed and does not tolerate the taint %s", g.Device, g.UUID, gpu.HealthReason, api.TaintUnhealthy)
		}
		u := usage[g.Device]
		if u == nil || g.Admin {
			continue
		}
		switch {
		case g.Whole && len(u.holders) > 0:
			return fmt.Errorf("GPU %s (%s) is allocated whole to this claim, but claims %s already hold it", g.Device, g.UUID, strings.Join(u.holders, ", "))
		case len(u.whole) > 0:
			return fmt.Errorf("GPU %s (%s) is held whole by claim %s", g.Device, g.UUID, u.whole[0])
		case u.mem+g.MemoryMiB > gpu.MemoryMiB:
			return fmt.Errorf("GPU %s (%s): memory %d MiB allocated to this claim and %d MiB to claims %s exceed its %d MiB", g.Device, g.UUID, g.MemoryMiB, u.mem, strings.Join(u.holders, ", "), gpu.MemoryMiB)
		case u.cores+g.Cores > api.MaxCores:
			return fmt.Errorf("GPU %s (%s): cores %d %% allocated to this claim and %d %% to claims %s exceed 100 %%", g.Device, g.UUID, g.Cores, u.cores, strings.Join(u.holders, ", "))
		case gpu.Sharing == api.SharingExclusive:
			return fmt.Errorf("GPU %s (%s) is exclusive and held by claims %s", g.Device, g.UUID, strings.Join(u.holders, ", "))
		case u.shares+1 > max(gpu.MaxShares, 1):
			return fmt.Errorf("GPU %s (%s): %d claims hold shares of it, its most is %d", g.Device, g.UUID, u.shares, gpu.MaxShares)
		}
		// Two shares of this claim on one GPU add up too.
		add("this claim", g)
	}
	return nil
}

// tolerations returns the devices whose results tolerate the unhealthy
// taint.
func tolerations(claim *resourceapi.ResourceClaim) map[string]bool {
	out := map[string]bool{}
	for _, r := range claim.Status.Allocation.Devices.Results {
		for _, t := range r.Tolerations {
			if (t.Key == api.TaintUnhealthy || (t.Key == "" && t.Operator == resourceapi.DeviceTolerationOpExists)) &&
				(t.Effect == "" || t.Effect == resourceapi.DeviceTaintEffectNoSchedule) {
				out[r.Device] = true
			}
		}
	}
	return out
}

// requestsOf lists the requests of the grants in result order.
func requestsOf(gs []Grant) []string {
	var out []string
	for _, g := range gs {
		if !slices.Contains(out, g.Request) {
			out = append(out, g.Request)
		}
	}
	return out
}

// cdiName is the CDI device name of a claim's request: unique per claim
// UID (so a runtime's spec cache never hits a stale entry) and request.
func cdiName(uid types.UID, request string) string {
	return string(uid) + "-" + strings.ReplaceAll(request, "/", "_")
}

// files writes what one prepared claim needs on the host and returns its
// checkpoint entry. On error nothing it wrote is left.
func (d *Driver) files(claim *resourceapi.ResourceClaim, gs []Grant, cfgs map[string]requestConfig, sole map[string]bool) (p *Prepared, err error) {
	p = &Prepared{Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID, Grants: gs,
		Spec: cdiapi.GenerateTransientSpecName(cdiVendor, cdiClass, string(claim.UID)) + ".json", Prepared: time.Now().UTC()}
	defer func() {
		if err != nil {
			d.remove(p)
			p = nil
		}
	}()
	spec := &cdispec.Spec{Kind: api.CDIKind}
	for _, req := range requestsOf(gs) {
		var mine []Grant
		for _, g := range gs {
			if g.Request == req {
				mine = append(mine, g)
			}
		}
		pr := PreparedRequest{Request: req, CDIDevice: cdiparser.QualifiedName(cdiVendor, cdiClass, cdiName(claim.UID, req))}
		edits, err := d.requestFiles(claim.UID, req, mine, cfgs[req], sole[resourceclaim.BaseRequestRef(req)], &pr)
		p.Requests = append(p.Requests, pr)
		if err != nil {
			return p, fmt.Errorf("request %q: %w", req, err)
		}
		spec.Devices = append(spec.Devices, cdispec.Device{Name: cdiName(claim.UID, req), ContainerEdits: edits})
	}
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return p, fmt.Errorf("CDI spec: %w", err)
	}
	spec.Version = v
	if err := d.cdi.WriteSpec(spec, p.Spec); err != nil {
		return p, fmt.Errorf("writing the CDI spec %s: %w", p.Spec, err)
	}
	return p, nil
}

// requestFiles writes one request's limiter files (when the limiter
// applies) and returns its CDI container edits; pr gets its directory and
// the driver's confirmation. A grant with a memory ceiling may burst
// past its guarantee: where the driver partitions its GPUs' memory and
// sole (one container uses the request), the driver holds soft = the
// guarantee and hard = the ceiling on that container's group (the device
// plugins' hook); otherwise the limiter lends it the GPU's unguaranteed
// memory from the budget files, as the request's one borrower.
func (d *Driver) requestFiles(uid types.UID, req string, gs []Grant, rc requestConfig, sole bool, pr *PreparedRequest) (cdispec.ContainerEdits, error) {
	uuids := make([]string, len(gs))
	limited, bursts := false, false
	cfg := limiterconf.Config{StatePath: filepath.Join(d.opts.Paths.StateContainer, stateFile), Elastic: rc.Elastic, ContextReserveMiB: rc.ContextReserveMiB}
	var driver []memlimits.Grant
	for i, g := range gs {
		uuids[i] = g.UUID
		gpuMiB := d.gpus[g.Device].MemoryMiB
		dev := limiterconf.Device{UUID: g.UUID}
		if g.Limited(gpuMiB) {
			limited = true
			if g.MemoryMiB < gpuMiB {
				dev.MemoryMiB = uint64(g.MemoryMiB)
			}
			if g.Cores > 0 && g.Cores < api.MaxCores {
				dev.SMPercent = int(g.Cores)
			}
			if g.CeilingMiB > g.MemoryMiB {
				dev.Burst(uint64(g.CeilingMiB))
				bursts = true
			}
		}
		if !g.Whole && !g.Admin {
			driver = append(driver, deviceplugin.Grant(g.UUID, g.MemoryMiB, g.CeilingMiB))
		}
		cfg.Devices = append(cfg.Devices, dev)
	}
	edits := cdispec.ContainerEdits{Env: []string{api.EnvVisibleDevices + "=" + strings.Join(uuids, ",")}}
	if !limited {
		return edits, nil
	}
	if bursts {
		cfg.Borrower = Borrower(uid, req)
	}
	if len(driver) < len(gs) || !sole {
		driver = nil
	}
	driver = d.opts.DriverLimits.Partitioned(driver)
	b, err := limiterconf.Encode(cfg)
	if err != nil {
		return edits, fmt.Errorf("limits file: %w", err)
	}
	dir := filepath.Join(d.opts.ClaimRoot, string(uid), strings.ReplaceAll(req, "/", "_"))
	pr.Dir = dir
	state := filepath.Join(dir, stateName)
	if err := os.MkdirAll(state, 0o755); err != nil {
		return edits, err
	}
	// The container's processes may run as any user and share the
	// limiter's file: world-writable, sticky.
	if err := os.Chmod(state, 0o777|os.ModeSticky); err != nil {
		return edits, err
	}
	limits := filepath.Join(dir, limitsName)
	if err := atomicfile.Write(limits, b, 0o444); err != nil {
		return edits, err
	}
	ro := []string{"ro", "nosuid", "nodev", "bind"}
	edits.Mounts = []*cdispec.Mount{
		{HostPath: d.opts.Paths.LimiterHost, ContainerPath: d.opts.Paths.LimiterContainer, Options: ro},
		{HostPath: d.opts.Paths.PreloadHost, ContainerPath: "/etc/ld.so.preload", Options: ro},
		{HostPath: limits, ContainerPath: limiterconf.Path, Options: ro},
		{HostPath: state, ContainerPath: d.opts.Paths.StateContainer, Options: []string{"rw", "nosuid", "nodev", "bind"}},
	}
	if bursts {
		if err := os.MkdirAll(d.opts.Paths.BudgetHost, 0o755); err != nil {
			return edits, fmt.Errorf("creating the GPU budget directory: %w", err)
		}
		edits.Mounts = append(edits.Mounts, &cdispec.Mount{HostPath: d.opts.Paths.BudgetHost, ContainerPath: limiterconf.BudgetDir, Options: ro})
	}
	if len(driver) > 0 {
		confirm := filepath.Join(dir, confirmName)
		if err := os.WriteFile(confirm, nil, 0o444); err != nil {
			return edits, fmt.Errorf("the driver's memory limits' confirmation: %w", err)
		}
		pr.Confirm = confirm
		edits.Hooks = d.opts.DriverLimits.Hooks(confirm, driver)
		edits.Mounts = append(edits.Mounts, deviceplugin.ConfirmMount(confirm))
		d.logger.V(2).Info("The driver holds the claim request's memory limits", "claim", uid, "request", req, "grants", driver)
	}
	return edits, nil
}

// remove deletes every file of a prepared claim: its CDI spec and its
// directory. Missing files are fine (unprepare is idempotent).
func (d *Driver) remove(p *Prepared) error {
	var errs []error
	if p.Spec != "" {
		if err := d.cdi.RemoveSpec(p.Spec); err != nil {
			errs = append(errs, fmt.Errorf("removing the CDI spec %s: %w", p.Spec, err))
		}
	}
	dir := filepath.Join(d.opts.ClaimRoot, string(p.UID))
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, fmt.Errorf("removing %s: %w", dir, err))
	}
	return errors.Join(errs...)
}

// devices is the kubelet's answer for a prepared claim: every allocated
// device, the first of each request carrying the request's CDI device
// (so a container gets it once however many GPUs the request has).
func (p *Prepared) devices(pool string) []kubeletDevice {
	var out []kubeletDevice
	seen := map[string]bool{}
	for _, g := range p.Grants {
		kd := kubeletDevice{Requests: []string{g.Request}, PoolName: pool, DeviceName: g.Device}
		if g.ShareID != "" {
			id := types.UID(g.ShareID)
			kd.ShareID = &id
		}
		if !seen[g.Request] {
			seen[g.Request] = true
			for _, r := range p.Requests {
				if r.Request == g.Request {
					kd.CDIDeviceIDs = []string{r.CDIDevice}
				}
			}
		}
		out = append(out, kd)
	}
	return out
}
