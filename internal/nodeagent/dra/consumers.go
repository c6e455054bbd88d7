package dra

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// checkConsumers checks the pods on this node the claim is reserved for.
// A container gets at most one request of this driver: each carries the
// container's NVIDIA_VISIBLE_DEVICES and its one limits file, which two
// would overwrite. And a pod that reached this node through the
// extended-resource mapping (nvidia.com/gpu served by DRA) must not ask
// for a share (gpumem, gpucores): it would get whole GPUs here.
func (d *Driver) checkConsumers(ctx context.Context, claim *resourceapi.ResourceClaim) error {
	for _, ref := range claim.Status.ReservedFor {
		if ref.APIGroup != "" || ref.Resource != "pods" {
			continue
		}
		pod, err := d.pod(ctx, claim.Namespace, ref.Name)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("reading pod %s, which the claim is reserved for: %w", ref.Name, err)
		}
		if pod.UID != ref.UID || pod.Spec.NodeName != d.opts.NodeName {
			continue
		}
		if err := d.checkPod(ctx, pod, claim); err != nil {
			return fmt.Errorf("pod %s: %w", pod.Name, err)
		}
	}
	return nil
}

func (d *Driver) pod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	if d.opts.Pods != nil {
		return d.opts.Pods(ctx, ns, name)
	}
	return d.opts.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
}

// driverRequests lists the requests of a claim this driver was allocated
// devices for (base names: a container names the request, not the
// subrequest); none when it is not allocated.
func driverRequests(c *resourceapi.ResourceClaim) []string {
	var out []string
	if c.Status.Allocation == nil {
		return nil
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		base := resourceclaim.BaseRequestRef(r.Request)
		if r.Driver == api.DRADriverName && !slices.Contains(out, base) {
			out = append(out, base)
		}
	}
	return out
}

func (d *Driver) checkPod(ctx context.Context, pod *corev1.Pod, claim *resourceapi.ResourceClaim) error {
	reqs := map[string][]string{claim.Name: driverRequests(claim)}
	resolve := func(name string) ([]string, error) {
		if r, ok := reqs[name]; ok {
			return r, nil
		}
		c, err := d.opts.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			reqs[name] = nil
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading its claim %s: %w", name, err)
		}
		reqs[name] = driverRequests(c)
		return reqs[name], nil
	}
	extended := ""
	if s := pod.Status.ExtendedResourceClaimStatus; s != nil {
		extended = s.ResourceClaimName
	}
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			c := &cs[i]
			var got []string
			for _, cr := range c.Resources.Claims {
				k := slices.IndexFunc(pod.Spec.ResourceClaims, func(pc corev1.PodResourceClaim) bool { return pc.Name == cr.Name })
				if k < 0 {
					continue
				}
				name, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[k])
				if err != nil || name == nil {
					continue
				}
				rs, err := resolve(*name)
				if err != nil {
					return err
				}
				for _, r := range rs {
					if cr.Request == "" || cr.Request == r {
						got = append(got, fmt.Sprintf("claim %s request %s", *name, r))
					}
				}
			}
			if extended != "" {
				rs, err := resolve(extended)
				if err != nil {
					return err
				}
				for _, m := range pod.Status.ExtendedResourceClaimStatus.RequestMappings {
					if m.ContainerName != c.Name || !slices.Contains(rs, m.RequestName) {
						continue
					}
					got = append(got, fmt.Sprintf("%s (claim %s request %s)", m.ResourceName, extended, m.RequestName))
					if extended == claim.Name {
						if err := wholeOnly(c, d.opts.Names); err != nil {
							return err
						}
					}
				}
			}
			if len(got) > 1 {
				return fmt.Errorf("container %q would get %d GPU requests of %s (%s); a container gets one (its GPUs and limits): ask for several GPUs with count in one request",
					c.Name, len(got), api.DRADriverName, strings.Join(got, ", "))
			}
		}
	}
	return nil
}

// wholeOnly refuses a container that asks for a GPU share (HAMi's
// gpumem, gpumem-percentage below 100, gpucores below 100) beside the GPU
// count the extended-resource mapping serves whole on this node.
func wholeOnly(c *corev1.Container, names api.ResourceNames) error {
	if names.GPU == "" {
		return nil
	}
	r, err := kubeobj.ReadResources(c, names)
	if err != nil {
		return err
	}
	var share []string
	if r.HasMemory && r.MemoryMiB > 0 {
		share = append(share, fmt.Sprintf("%s %d", names.Memory, r.MemoryMiB))
	}
	if r.HasPercent && r.MemoryPercent > 0 && r.MemoryPercent < 100 {
		share = append(share, fmt.Sprintf("%s %d", names.MemoryPercentage, r.MemoryPercent))
	}
	if r.HasCores && r.Cores > 0 && r.Cores < api.MaxCores {
		share = append(share, fmt.Sprintf("%s %d", names.Cores, r.Cores))
	}
	if len(share) == 0 {
		return nil
	}
	return fmt.Errorf("container %q asks for a GPU share (%s) beside %s, which this DRA node serves as whole GPUs (DeviceClass %s); shares are placed on device-plugin nodes, or ask with a ResourceClaim for capacity memory and cores (docs/dra.md)",
		c.Name, strings.Join(share, ", "), names.GPU, api.DeviceClassExtendedResource)
}

// soleUsers lists the claim's requests (base names) that exactly one
// container uses, in a claim generated for one pod (from its template:
// the pod owns it, and no other pod can reserve it): the driver's
// memory limits are set per container group, so a request whose grant
// several containers share (or may share later: a claim pods name)
// keeps the limiter's one limit for all of them.
func (d *Driver) soleUsers(ctx context.Context, claim *resourceapi.ResourceClaim) map[string]bool {
	owner := metav1.GetControllerOf(claim)
	if owner == nil || owner.APIVersion != "v1" || owner.Kind != "Pod" || len(claim.Status.ReservedFor) != 1 || claim.Status.ReservedFor[0].UID != owner.UID {
		return nil
	}
	pod, err := d.pod(ctx, claim.Namespace, owner.Name)
	if err != nil || pod.UID != owner.UID {
		return nil
	}
	users := map[string]int{}
	reqs := driverRequests(claim)
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			for _, cr := range cs[i].Resources.Claims {
				k := slices.IndexFunc(pod.Spec.ResourceClaims, func(pc corev1.PodResourceClaim) bool { return pc.Name == cr.Name })
				if k < 0 {
					continue
				}
				if name, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[k]); err != nil || name == nil || *name != claim.Name {
					continue
				}
				for _, r := range reqs {
					if cr.Request == "" || cr.Request == r {
						users[r]++
					}
				}
			}
		}
	}
	out := map[string]bool{}
	for r, n := range users {
		out[r] = n == 1
	}
	return out
}
