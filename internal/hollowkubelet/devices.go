package hollowkubelet

import (
	"context"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
)

// podDevices reads the devices the kubelet allocated to containers from
// its pod-resources API.
type podDevices struct {
	socket string
	mu     sync.Mutex
	client podresourcesapi.PodResourcesListerClient
	conn   *grpc.ClientConn
}

// of returns the devices of a container, by resource, or none when the
// kubelet cannot say.
func (d *podDevices) of(ctx context.Context, ns, pod, name string) []Devices {
	d.mu.Lock()
	if d.client == nil {
		c, conn, err := podresources.GetV1Client(d.socket, 10*time.Second, 16<<20)
		if err != nil {
			d.mu.Unlock()
			return nil
		}
		d.client, d.conn = c, conn
	}
	client := d.client
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := client.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return nil
	}
	byRes := map[string][]string{}
	for _, p := range resp.PodResources {
		if p.Namespace != ns || p.Name != pod {
			continue
		}
		for _, c := range p.Containers {
			if c.Name != name {
				continue
			}
			for _, dev := range c.Devices {
				byRes[dev.ResourceName] = append(byRes[dev.ResourceName], dev.DeviceIds...)
			}
		}
	}
	var out []Devices
	for res, ids := range byRes {
		sort.Strings(ids)
		out = append(out, Devices{Resource: res, IDs: ids})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Resource < out[j].Resource })
	return out
}
