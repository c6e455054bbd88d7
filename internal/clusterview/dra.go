package clusterview

// DRA in the views: Tessera's GPUs served through ResourceClaims (driver
// gpu.tessera.io, docs/dra.md) have no allocation record; who holds which
// part of a GPU is in the claims' status.allocation (device results with
// the consumed capacity and share ID) and status.reservedFor (the pods
// using the claim). Collect reads them with the nodes' ResourceSlices
// (which device is which GPU) and charges each allocated claim to the
// placement core like a record, so the views, the packing figures and
// the invariant checker count them.

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// ClaimUse is one ResourceClaim's part of one GPU: once per claim, with
// every pod that uses it.
type ClaimUse struct {
	// Claim is the claim's "namespace/name".
	Claim     string `json:"claim"`
	MemoryMiB int64  `json:"memoryMiB"`
	Cores     int    `json:"cores"`
	Whole     bool   `json:"whole,omitempty"`
	// Pods are the pods the claim is reserved for (status.reservedFor).
	Pods []string `json:"pods,omitempty"`
}

// draState is what Collect read of DRA: the published devices by
// pool/device, the claims and templates by namespace/name, and the
// nodes that publish Tessera devices.
type draState struct {
	devices   map[string]sliceDevice
	claims    map[string]*resourceapi.ResourceClaim
	templates map[string]*resourceapi.ResourceClaimTemplate
	nodes     map[string]bool
}

// sliceDevice is one GPU a node's ResourceSlice publishes.
type sliceDevice struct {
	node string
	gpu  api.GPU
}

// readDRA lists Tessera's ResourceSlices, the claims and the claim
// templates. An API server that does not serve resource.k8s.io/v1 has no
// DRA: nothing is read and no error returned. A user who may not list
// them gets the views without DRA and the refusal as unread (the
// report's DRA error), not a failed command.
func readDRA(ctx context.Context, client kubernetes.Interface) (s *draState, unread error, err error) {
	s = &draState{devices: map[string]sliceDevice{}, claims: map[string]*resourceapi.ResourceClaim{},
		templates: map[string]*resourceapi.ResourceClaimTemplate{}, nodes: map[string]bool{}}
	slices, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return s, nil, nil
	}
	if apierrors.IsForbidden(err) {
		return s, fmt.Errorf("listing ResourceSlices: %w", err), nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("listing ResourceSlices: %w", err)
	}
	for i := range slices.Items {
		sl := &slices.Items[i]
		if sl.Spec.Driver != api.DRADriverName || sl.Spec.NodeName == nil {
			continue
		}
		node := *sl.Spec.NodeName
		s.nodes[node] = true
		for _, d := range sl.Spec.Devices {
			s.devices[sl.Spec.Pool.Name+"/"+d.Name] = sliceDevice{node: node, gpu: sliceGPU(d)}
		}
	}
	claims, err := client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if apierrors.IsForbidden(err) {
		return s, fmt.Errorf("listing ResourceClaims: %w", err), nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("listing ResourceClaims: %w", err)
	}
	for i := range claims.Items {
		c := &claims.Items[i]
		s.claims[c.Namespace+"/"+c.Name] = c
	}
	templates, err := client.ResourceV1().ResourceClaimTemplates(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if apierrors.IsForbidden(err) {
		return s, fmt.Errorf("listing ResourceClaimTemplates: %w", err), nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("listing ResourceClaimTemplates: %w", err)
	}
	for i := range templates.Items {
		t := &templates.Items[i]
		s.templates[t.Namespace+"/"+t.Name] = t
	}
	return s, nil, nil
}

// sliceGPU is the GPU a published device describes (docs/dra.md, "What a
// GPU looks like in the slice"): for nodes without a Tessera inventory,
// and for the devices' UUIDs.
func sliceGPU(d resourceapi.Device) api.GPU {
	g := api.GPU{Index: -1, NUMANode: -1, Health: api.Healthy, Sharing: api.SharingShared, MaxShares: 1}
	attr := func(name string) resourceapi.DeviceAttribute { return d.Attributes[resourceapi.QualifiedName(name)] }
	if v := attr(api.AttrUUID).StringValue; v != nil {
		g.UUID = *v
	}
	if v := attr(api.AttrIndex).IntValue; v != nil {
		g.Index = int(*v)
	}
	if v := attr(api.AttrProductName).StringValue; v != nil {
		g.Model = *v
	}
	if v := attr(api.AttrSharing).StringValue; v != nil && *v == "exclusive" {
		g.Sharing = api.SharingExclusive
	}
	if c, ok := d.Capacity[api.CapacityMemory]; ok {
		g.MemoryMiB = c.Value.Value() >> 20
	}
	if c, ok := d.Capacity[api.CapacityShares]; ok {
		g.MaxShares = int(c.Value.Value())
	}
	for _, t := range d.Taints {
		if t.Key == api.TaintUnhealthy {
			g.Health, g.HealthReason = api.Unhealthy, t.Value
		}
	}
	return g
}

// sliceInventories are the inventories of the nodes that publish
// Tessera devices but carry no inventory annotation, built from their
// slices.
func (s *draState) sliceInventories(has func(node string) bool) map[string]*api.NodeInventory {
	out := map[string]*api.NodeInventory{}
	keys := make([]string, 0, len(s.devices))
	for k := range s.devices {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		d := s.devices[k]
		if has(d.node) {
			continue
		}
		inv := out[d.node]
		if inv == nil {
			inv = &api.NodeInventory{APIVersion: api.InventoryAPIVersion, Kind: api.InventoryKind, MemoryOvercommit: 1, Mode: api.ModeDRA}
			out[d.node] = inv
		}
		g := d.gpu
		if g.Index < 0 {
			g.Index = len(inv.GPUs)
		}
		inv.GPUs = append(inv.GPUs, g)
	}
	return out
}

// claimGrants are the GPUs an allocated claim holds, by node, as device
// grants of the placement core (a device allocated whole: exclusive, all
// its memory and cores; admin access holds nothing).
func (s *draState) claimGrants(c *placement.Cluster, claim *resourceapi.ResourceClaim) (map[string][]api.DeviceGrant, error) {
	devs, err := kubeobj.ClaimDevices(claim)
	if err != nil {
		return nil, err
	}
	out := map[string][]api.DeviceGrant{}
	for _, d := range devs {
		if d.Admin {
			continue
		}
		sd, ok := s.devices[d.Pool+"/"+d.Device]
		if !ok {
			return nil, fmt.Errorf("status.allocation.devices.results[%d]: device %s/%s is in no ResourceSlice of %s", d.Index, d.Pool, d.Device, api.DRADriverName)
		}
		g := api.DeviceGrant{UUID: sd.gpu.UUID, MemoryMiB: d.MemoryMiB, Cores: int(d.Cores)}
		if d.Whole {
			g.Exclusive, g.MemoryMiB, g.Cores = true, sd.gpu.MemoryMiB, api.MaxCores
			if n := c.Node(sd.node); n != nil {
				if i := n.GPUByUUID(g.UUID); i >= 0 {
					g.MemoryMiB = n.GPUs[i].MemoryMiB
				}
			}
		}
		out[sd.node] = append(out[sd.node], g)
	}
	return out, nil
}

// reservedPods are the pods a claim is reserved for, as namespace/name.
func reservedPods(claim *resourceapi.ResourceClaim) []string {
	var out []string
	for _, r := range claim.Status.ReservedFor {
		if r.Resource == "pods" && r.APIGroup == "" {
			out = append(out, claim.Namespace+"/"+r.Name)
		}
	}
	sort.Strings(out)
	return out
}

// assignClaims charges every allocated claim to the placement core (key
// "claim:namespace/name") and returns the claims' use of each GPU by
// UUID. Errors are the invariant checker's findings.
func (s *draState) assignClaims(c *placement.Cluster) (map[string][]ClaimUse, []error) {
	keys := make([]string, 0, len(s.claims))
	for k := range s.claims {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	uses := map[string][]ClaimUse{}
	var errs []error
	for _, k := range keys {
		claim := s.claims[k]
		byNode, err := s.claimGrants(c, claim)
		if err != nil {
			errs = append(errs, fmt.Errorf("claim %s: %w", k, err))
			continue
		}
		nodes := make([]string, 0, len(byNode))
		for n := range byNode {
			nodes = append(nodes, n)
		}
		sort.Strings(nodes)
		pods := reservedPods(claim)
		for _, node := range nodes {
			gs := byNode[node]
			rec := &api.PodAllocation{Node: node, Containers: []api.ContainerAllocation{{Name: claim.Name, Devices: gs}}}
			key := "claim:" + k
			if len(nodes) > 1 {
				key += "@" + node
			}
			if c.Node(node) == nil {
				errs = append(errs, fmt.Errorf("claim %s: allocated on node %s, which has no inventory", k, node))
			} else if err := c.AssignRecord(key, 0, 0, rec); err != nil {
				errs = append(errs, err)
			}
			for _, g := range gs {
				uses[g.UUID] = append(uses[g.UUID], ClaimUse{Claim: k, MemoryMiB: g.MemoryMiB, Cores: g.Cores, Whole: g.Exclusive, Pods: pods})
			}
		}
	}
	return uses, errs
}

// podClaimName is the ResourceClaim a pod's spec.resourceClaims entry
// names: the claim it names, or the one generated from its template
// (status.resourceClaimStatuses; "" until the controller made it).
func podClaimName(p *corev1.Pod, pc corev1.PodResourceClaim) string {
	if pc.ResourceClaimName != nil {
		return *pc.ResourceClaimName
	}
	for _, st := range p.Status.ResourceClaimStatuses {
		if st.Name == pc.Name && st.ResourceClaimName != nil {
			return *st.ResourceClaimName
		}
	}
	return ""
}

// claimContainers are the pod's containers' devices from its allocated
// Tessera claims (a container entry resources.claims names a pod claim,
// and optionally one of its requests).
func (s *draState) claimContainers(c *placement.Cluster, p *corev1.Pod) []ContainerReport {
	byName := map[string]string{}
	for _, pc := range p.Spec.ResourceClaims {
		byName[pc.Name] = podClaimName(p, pc)
	}
	var out []ContainerReport
	add := func(ct *corev1.Container, init bool) {
		cr := ContainerReport{Name: ct.Name, Init: init}
		for _, rc := range ct.Resources.Claims {
			claim := s.claims[p.Namespace+"/"+byName[rc.Name]]
			if claim == nil {
				continue
			}
			devs, err := kubeobj.ClaimDevices(claim)
			if err != nil {
				continue // the invariant checker names it
			}
			for _, d := range devs {
				if d.Admin || (rc.Request != "" && d.Request != rc.Request && !strings.HasPrefix(d.Request, rc.Request+"/")) {
					continue
				}
				sd, ok := s.devices[d.Pool+"/"+d.Device]
				if !ok {
					continue
				}
				g := api.DeviceGrant{UUID: sd.gpu.UUID, MemoryMiB: d.MemoryMiB, Cores: int(d.Cores), Exclusive: d.Whole}
				dr := deviceReport(c.Node(sd.node), g)
				if d.Whole && dr.GPU < 0 {
					dr.MemoryMiB, dr.Cores = sd.gpu.MemoryMiB, api.MaxCores
				}
				dr.Claim = claim.Name
				cr.Devices = append(cr.Devices, dr)
			}
		}
		if len(cr.Devices) > 0 {
			out = append(out, cr)
		}
	}
	for i := range p.Spec.InitContainers {
		add(&p.Spec.InitContainers[i], true)
	}
	for i := range p.Spec.Containers {
		add(&p.Spec.Containers[i], false)
	}
	return out
}

// ClaimRequest is what one request of a claim asks of Tessera's driver.
type ClaimRequest = kubeobj.ClaimRequest

// claimRequests are a claim spec's requests of Tessera's classes; for a
// prioritized list its first subrequest, the one the scheduler tries
// first.
func claimRequests(spec resourceapi.ResourceClaimSpec) []ClaimRequest {
	var out []ClaimRequest
	for _, r := range kubeobj.ClaimRequests(spec) {
		if len(out) > 0 && out[len(out)-1].Request == r.Request {
			continue
		}
		out = append(out, r)
	}
	return out
}

// podClaimSpecs are the claim specs a pod uses through Tessera's classes,
// by the pod's claim name: the claim's (once it exists) or its
// template's. missing names the claims and templates not found.
func (s *draState) podClaimSpecs(p *corev1.Pod) (specs map[string]podClaimSpec, missing []string) {
	specs = map[string]podClaimSpec{}
	for _, pc := range p.Spec.ResourceClaims {
		var ps podClaimSpec
		if name := podClaimName(p, pc); name != "" {
			c := s.claims[p.Namespace+"/"+name]
			if c == nil {
				missing = append(missing, "ResourceClaim "+name)
				continue
			}
			ps = podClaimSpec{Claim: name, Requests: claimRequests(c.Spec), Allocated: c.Status.Allocation != nil}
			if pc.ResourceClaimTemplateName != nil {
				ps.Template = *pc.ResourceClaimTemplateName
			}
		} else if pc.ResourceClaimTemplateName != nil {
			t := s.templates[p.Namespace+"/"+*pc.ResourceClaimTemplateName]
			if t == nil {
				missing = append(missing, "ResourceClaimTemplate "+*pc.ResourceClaimTemplateName)
				continue
			}
			ps = podClaimSpec{Template: t.Name, Requests: claimRequests(t.Spec.Spec)}
		}
		if len(ps.Requests) > 0 {
			specs[pc.Name] = ps
		}
	}
	return specs, missing
}

// podClaimSpec is one pod claim's requests of Tessera's driver.
type podClaimSpec struct {
	Claim     string
	Template  string
	Requests  []ClaimRequest
	Allocated bool
}

// usesTesseraDRA reports whether a pod asks Tessera's DRA classes.
func (s *draState) usesTesseraDRA(p *corev1.Pod) bool {
	if s == nil || len(p.Spec.ResourceClaims) == 0 {
		return false
	}
	specs, missing := s.podClaimSpecs(p)
	return len(specs) > 0 || len(missing) > 0
}
