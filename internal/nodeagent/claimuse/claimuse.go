// Package claimuse finds which containers of a node's pods use which
// requests of the DRA claims the node's driver prepared: a container's
// resources.claims entry names a pod claim, which names the ResourceClaim
// (or the template whose claim the pod's status names), and optionally
// one request; a pod served nvidia.com/gpu through the extended-resource
// mapping names its claim and requests in its status. A request shared by
// several containers has one limiter state, and one grant, for all of
// them. The node agent's metrics and its host-side reconciler read the
// claims' grants through it.
package claimuse

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
)

// Claim is a DRA ResourceClaim prepared on the node: what the containers
// that use it were given.
type Claim struct {
	Namespace, Name string
	Requests        []Request
}

// Request is one request of a claim the node's DRA driver serves.
type Request struct {
	// Request is the request's name (a prioritized list's subrequest as
	// "request/subrequest": containers name the request).
	Request string
	// StateFile is the limiter's shared-state file of the request on the
	// host; "" when the limiter does not apply (whole GPUs).
	StateFile string
	// Confirm is the host path of the driver-held memory limits'
	// confirmation of the request's one container; "" when the limiter
	// holds its memory.
	Confirm string
	// Borrower is the request's name in the GPU budget files (its
	// containers borrow past their shared guarantee as one).
	Borrower string
	// Devices are the request's GPUs in the order of its limits file (the
	// limiter's device index).
	Devices []Device
}

// Device is one GPU of a claim request: its share, or Whole, or Admin
// (admin access: visible, nothing consumed).
type Device struct {
	UUID      string
	MemoryMiB int64
	// CeilingMiB, above MemoryMiB (the guarantee), is the most the
	// request's containers may hold together; 0: none.
	CeilingMiB int64
	Cores      int64
	Whole      bool
	Admin      bool
}

// Use is one container's use of one claim request.
type Use struct {
	Pod       *v1.Pod
	Container string
	// Init: an init container that runs to completion (not a sidecar).
	Init    bool
	Claim   *Claim
	Request *Request
}

// Key names the request the use is of: containers with the same key
// share one grant.
func (u Use) Key() string {
	return u.Claim.Namespace + "/" + u.Claim.Name + "/" + u.Request.Request
}

// Uses lists, for the pods that have not finished, each container's use
// of a prepared claim's request, once per container and request (a
// request reached twice, by name and as all of its claim, is one use).
func Uses(pods []*v1.Pod, claims []Claim) []Use {
	byName := map[string]*Claim{}
	for i := range claims {
		byName[claims[i].Namespace+"/"+claims[i].Name] = &claims[i]
	}
	if len(byName) == 0 {
		return nil
	}
	var out []Use
	seen := map[string]bool{}
	add := func(p *v1.Pod, container string, init bool, cl *Claim, request string) {
		for i := range cl.Requests {
			r := &cl.Requests[i]
			if request != "" && resourceclaim.BaseRequestRef(r.Request) != request {
				continue
			}
			key := string(p.UID) + "/" + container + "/" + cl.Name + "/" + r.Request
			if seen[key] {
				continue
			}
			seen[key] = true
			out = append(out, Use{Pod: p, Container: container, Init: init, Claim: cl, Request: r})
		}
	}
	for _, p := range pods {
		if p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			continue
		}
		type ctr struct {
			c    *v1.Container
			init bool
		}
		var cs []ctr
		for i := range p.Spec.InitContainers {
			c := &p.Spec.InitContainers[i]
			cs = append(cs, ctr{c, c.RestartPolicy == nil || *c.RestartPolicy != v1.ContainerRestartPolicyAlways})
		}
		for i := range p.Spec.Containers {
			cs = append(cs, ctr{&p.Spec.Containers[i], false})
		}
		for _, c := range cs {
			for _, cr := range c.c.Resources.Claims {
				for k := range p.Spec.ResourceClaims {
					if p.Spec.ResourceClaims[k].Name != cr.Name {
						continue
					}
					name, _, err := resourceclaim.Name(p, &p.Spec.ResourceClaims[k])
					if err != nil || name == nil {
						continue
					}
					if cl, ok := byName[p.Namespace+"/"+*name]; ok {
						add(p, c.c.Name, c.init, cl, cr.Request)
					}
				}
			}
			if s := p.Status.ExtendedResourceClaimStatus; s != nil {
				cl, ok := byName[p.Namespace+"/"+s.ResourceClaimName]
				for _, m := range s.RequestMappings {
					if ok && m.ContainerName == c.c.Name {
						add(p, c.c.Name, c.init, cl, m.RequestName)
					}
				}
			}
		}
	}
	return out
}
