package hollowkubelet

import (
	"context"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
)

// podDevices reads the devices the kubelet allocated to containers from
// its pod-resources API (Get, GA in v1.36).
type podDevices struct {
	socket string
	mu     sync.Mutex
	client podresourcesapi.PodResourcesListerClient
	conn   *grpc.ClientConn
}

// of returns the devices of a container, by resource, or none when the
// kubelet cannot say.
func (d *podDevices) of(ctx context.Context, ns, pod, name string) ([]Devices, error) {
	d.mu.Lock()
	if d.client == nil {
		c, conn, err := podresources.GetV1Client(d.socket, 10*time.Second, 16<<20)
		if err != nil {
			d.mu.Unlock()
			return nil, err
		}
		d.client, d.conn = c, conn
	}
	client := d.client
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var resp *podresourcesapi.GetPodResourcesResponse
	var err error
	// The kubelet rate-limits its pod-resources API (and serves it only
	// once it runs): busy is not an answer.
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		resp, err = client.Get(ctx, &podresourcesapi.GetPodResourcesRequest{PodName: pod, PodNamespace: ns})
		if c := status.Code(err); c != codes.ResourceExhausted && c != codes.Unavailable {
			break
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
	}
	if err != nil {
		return nil, err
	}
	byRes := map[string][]string{}
	for _, c := range resp.GetPodResources().GetContainers() {
		if c.Name != name {
			continue
		}
		for _, dev := range c.Devices {
			byRes[dev.ResourceName] = append(byRes[dev.ResourceName], dev.DeviceIds...)
		}
	}
	var out []Devices
	for res, ids := range byRes {
		sort.Strings(ids)
		out = append(out, Devices{Resource: res, IDs: ids})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Resource < out[j].Resource })
	return out, nil
}
