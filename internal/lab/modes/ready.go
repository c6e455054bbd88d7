package modes

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/nodeagent/config"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// SetUp runs the Setup of every mode that has a node in the lab, once.
func SetUp(ctx context.Context, client kubernetes.Interface, nodes []NodeSpec) error {
	done := map[string]bool{}
	for _, n := range nodes {
		if done[n.Mode] {
			continue
		}
		done[n.Mode] = true
		m, err := Named(n.Mode)
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		if m.Setup != nil {
			if err := m.Setup(ctx, client); err != nil {
				return fmt.Errorf("setting up mode %s: %w", m.Name, err)
			}
		}
	}
	return nil
}

// NodeReady says whether the node is Ready and serves its GPUs as its
// profile says (sharing: its agent has applied it; an agent publishes an
// inventory before its ConfigMap cache has synced): its mode's Serving,
// by default its inventory published and a device-plugin resource
// allocatable.
func NodeReady(ctx context.Context, client kubernetes.Interface, spec NodeSpec, profile config.Node) bool {
	n, err := client.CoreV1().Nodes().Get(ctx, spec.Name, metav1.GetOptions{})
	if err != nil {
		return false
	}
	if m, err := Named(spec.Mode); err == nil && m.Serving != nil {
		if !m.Serving(ctx, client, n) {
			return false
		}
	} else if !servesDevicePlugin(n) || !sharesAs(n, profile) {
		return false
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// servesDevicePlugin: the node agent published the inventory and the
// device plugin serves some GPU device resource: the GPU's, its shared
// rename, a MIG profile's.
func servesDevicePlugin(n *corev1.Node) bool {
	if n.Annotations[api.AnnotationInventory] == "" {
		return false
	}
	for r, q := range n.Status.Allocatable {
		if api.DefaultResourceNames.IsCountResource(string(r)) && q.Value() > 0 {
			return true
		}
	}
	return false
}

// sharesAs: the node's inventory shares its GPUs as the profile says
// (a zero profile accepts any).
func sharesAs(n *corev1.Node, profile config.Node) bool {
	if profile.Sharing == "" {
		return true
	}
	inv, err := kubeobj.Inventory(n)
	if err != nil || inv == nil {
		return false
	}
	for _, g := range inv.GPUs {
		if !gpuSharesAs(g, profile) {
			return false
		}
	}
	return true
}

// gpuSharesAs: the GPU is shared as the profile says once applied. On a
// MIG node a GPU without MIG is published exclusive: a GPU that is not
// MIG-capable always, and one whose MIG mode a static layout turns off or
// leaves alone.
func gpuSharesAs(g api.GPU, profile config.Node) bool {
	switch profile.Sharing {
	case api.SharingMIGDynamic:
		return g.Sharing == api.SharingMIGDynamic || !g.MIG.Capable && g.Sharing == api.SharingExclusive
	case api.SharingMIG:
		either := g.Sharing == api.SharingMIG || g.Sharing == api.SharingExclusive
		l := profile.Layout
		if l == nil || len(l.Entries) == 0 || !g.MIG.Capable {
			return either
		}
		for _, e := range l.Entries {
			if e.Devices != nil || len(e.DeviceFilter) > 0 || e.MIGEnabled != l.Entries[0].MIGEnabled {
				return either // per GPU: which entry applies needs the PCI ID
			}
		}
		if l.Entries[0].MIGEnabled {
			return g.Sharing == api.SharingMIG
		}
		return g.Sharing == api.SharingExclusive
	}
	return g.Sharing == profile.Sharing
}
