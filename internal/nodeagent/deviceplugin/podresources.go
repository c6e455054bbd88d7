package deviceplugin

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultPodResourcesSocket is the kubelet's pod-resources socket.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// PodResources lists the kubelet's pods through its pod-resources API.
type PodResources struct {
	Socket   string
	Resource string
	// Timeout bounds one List, retries included (default 5s).
	Timeout time.Duration

	mu   sync.Mutex
	conn *grpc.ClientConn
}

func (r *PodResources) client() (podresourcesv1.PodResourcesListerClient, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn == nil {
		conn, err := grpc.NewClient("unix://"+r.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		r.conn = conn
	}
	return podresourcesv1.NewPodResourcesListerClient(r.conn), nil
}

// List implements KubeletPods. The kubelet rate-limits the API (100 QPS,
// burst 10, shared by every client) and a burst of admissions asks twice
// per container, so ResourceExhausted is retried with backoff.
func (r *PodResources) List(ctx context.Context) ([]KubeletPod, error) {
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := r.client()
	if err != nil {
		return nil, err
	}
	var resp *podresourcesv1.ListPodResourcesResponse
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		resp, err = c.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
		if status.Code(err) != codes.ResourceExhausted {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("pod-resources List on %s: still rate-limited after %v: %w", r.Socket, timeout, err)
		case <-time.After(wait):
		}
	}
	if err != nil {
		return nil, fmt.Errorf("pod-resources List on %s: %w", r.Socket, err)
	}
	out := make([]KubeletPod, 0, len(resp.PodResources))
	for _, pr := range resp.PodResources {
		kp := KubeletPod{Namespace: pr.Namespace, Name: pr.Name, Devices: map[string][]string{}}
		for _, c := range pr.Containers {
			for _, d := range c.Devices {
				if d.ResourceName == r.Resource {
					kp.Devices[c.Name] = append(kp.Devices[c.Name], d.DeviceIds...)
				}
			}
		}
		out = append(out, kp)
	}
	return out, nil
}

// Close releases the connection.
func (r *PodResources) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn == nil {
		return nil
	}
	err := r.conn.Close()
	r.conn = nil
	return err
}
