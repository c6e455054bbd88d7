package modes

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/install"
	"github.com/tessera-gpu/tessera/internal/nodeagent/config"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// NodeConfigMap is the node agents' ConfigMap in the lab (namespace
// tessera-system): its keys are profiles, each node's
// tessera.io/node-config label picks one, and an agent logs each profile
// it applies or refuses (`kubectl label node … tessera.io/node-config=…`
// and editing the ConfigMap take effect without a restart).
const NodeConfigMap = "tessera-node-agent"

// Profiles are the lab's own node agent profiles: the modes' ProfileYAML
// by profile name (Tessera's default, NVIDIA's guides' configurations as
// written).
func Profiles() map[string]string {
	out := map[string]string{}
	for _, m := range registry {
		if m.ProfileYAML != "" {
			out[m.Profile] = m.ProfileYAML
		}
	}
	return out
}

// NodeProfiles are the ConfigMap's profiles: the shipped ConfigMap's
// (deploy/node-agent/configmap.yaml: mig-parted's layouts and mig-dynamic
// among them), the lab's (Profiles) and the user's (--node-config), each
// replacing the previous of the same name.
func NodeProfiles(user map[string]string) (map[string]string, error) {
	out, err := deploy.NodeAgentProfiles()
	if err != nil {
		return nil, err
	}
	maps.Copy(out, Profiles())
	maps.Copy(out, user)
	return out, nil
}

// ReadNodeConfig reads --node-config: a ConfigMap manifest (the agents'
// format, as deploy/node-agent/configmap.yaml) whose data keys are
// profiles. Every profile must parse; the error names the first that
// does not, and why.
func ReadNodeConfig(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(b, &cm); err != nil {
		return nil, fmt.Errorf("--node-config %s: not a ConfigMap manifest: %w", path, err)
	}
	if cm.Kind != "ConfigMap" {
		return nil, fmt.Errorf("--node-config %s: kind %q, want a ConfigMap whose data keys are node agent profiles (see deploy/node-agent/configmap.yaml)", path, cm.Kind)
	}
	if len(cm.Data) == 0 {
		return nil, fmt.Errorf("--node-config %s: the ConfigMap has no data: no profile", path)
	}
	keys := slices.Sorted(maps.Keys(cm.Data))
	for _, k := range keys {
		// A profile, or a mig-parted document of MIG layouts.
		b := []byte(cm.Data[k])
		_, perr := config.Parse(b, api.DefaultResourceNames)
		if perr == nil {
			continue
		}
		_, merr := config.ParseMIGParted(b)
		if merr == nil {
			continue
		}
		if strings.Contains(perr.Error(), "mig-parted document") {
			perr = merr
		}
		return nil, fmt.Errorf("--node-config %s: key %q: %w", path, k, perr)
	}
	return cm.Data, nil
}

// EnsureConfigMap creates the agents' ConfigMap, or, when the user gave
// --node-config, updates it with those profiles; otherwise a ConfigMap
// that exists (a lab started again in its directory) is kept with the
// user's edits. It returns the profile, with its MIG layout, the
// ConfigMap gives each node (what its agent publishes once it has applied
// it); a node whose profile does not resolve is an error naming it.
func EnsureConfigMap(ctx context.Context, client kubernetes.Interface, user map[string]string, nodes []NodeSpec) (map[string]config.Node, error) {
	data, err := NodeProfiles(user)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		if p := n.Labels[api.LabelNodeConfig]; p != "" && data[p] == "" {
			return nil, fmt.Errorf("node %s: profile %q is in neither the lab's profiles nor --node-config (%s)", n.Name, p, strings.Join(slices.Sorted(maps.Keys(data)), ", "))
		}
	}
	cms := client.CoreV1().ConfigMaps(install.Namespace)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: install.Namespace, Name: NodeConfigMap}, Data: data}
	if _, err = cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("node agent ConfigMap: %w", err)
	}
	cur, err := cms.Get(ctx, NodeConfigMap, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("node agent ConfigMap: %w", err)
	}
	if len(user) > 0 {
		if cur.Data == nil {
			cur.Data = map[string]string{}
		}
		maps.Copy(cur.Data, user)
		if cur, err = cms.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("node agent ConfigMap: %w", err)
		}
	}
	out := map[string]config.Node{}
	for _, n := range nodes {
		_, c, err := config.Resolve(cur.Data, n.Labels, api.DefaultResourceNames)
		if err != nil {
			return nil, fmt.Errorf("node %s, ConfigMap %s/%s: %w", n.Name, install.Namespace, NodeConfigMap, err)
		}
		out[n.Name] = c
	}
	return out, nil
}
