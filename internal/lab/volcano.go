package lab

// Volcano in the lab (docs/volcano.md): `tessera-lab up --volcano` runs
// Volcano's own scheduler and controller manager (a released version,
// built by hack/volcano/build.sh) beside Tessera's components, with the
// release's CRDs, and a node in mode volcano whose agent speaks Volcano's
// vGPU protocol. Volcano's scheduler sees only the nodes whose profile is
// volcano or dra (its --node-select), as docs/volcano.md advises; Tessera's
// scheduler sees no volcano node (its agent publishes no inventory).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/install"
	"github.com/tessera-gpu/tessera/internal/lab/apply"
	"github.com/tessera-gpu/tessera/internal/lab/component"
	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/lab/modes"
	"github.com/tessera-gpu/tessera/internal/lab/pki"
	"github.com/tessera-gpu/tessera/internal/lab/poll"
	"github.com/tessera-gpu/tessera/internal/lab/supervisor"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Volcano's components and their identities (Volcano's installer's names:
// the admission policy of deploy/volcano names the scheduler's).
const (
	VolcanoNamespace         = "volcano-system"
	VolcanoSchedulerAccount  = "volcano-scheduler"
	VolcanoControllerAccount = "volcano-controllers"
	// The supervisor's names of the two processes.
	VolcanoScheduler         = "volcano-scheduler"
	VolcanoControllerManager = "volcano-controller-manager"
)

// VolcanoBinaries are what hack/volcano/build.sh puts in a directory.
type VolcanoBinaries string

// Scheduler, ControllerManager, CRDs and Version are its files.
func (v VolcanoBinaries) Scheduler() string { return filepath.Join(string(v), "vc-scheduler") }
func (v VolcanoBinaries) ControllerManager() string {
	return filepath.Join(string(v), "vc-controller-manager")
}
func (v VolcanoBinaries) CRDs() string { return filepath.Join(string(v), "crd") }
func (v VolcanoBinaries) Version() string {
	b, err := os.ReadFile(filepath.Join(string(v), "VERSION"))
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// Check says what is missing.
func (v VolcanoBinaries) Check() error {
	for _, p := range []string{v.Scheduler(), v.ControllerManager(), v.CRDs()} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("the Volcano build: %v (build them with `make volcano` or hack/volcano/build.sh %s)", err, v)
		}
	}
	return nil
}

// volcanoNodeSelectors are the nodes Volcano's scheduler sees: those whose
// profile is one of Tessera's volcano modes, and the DRA nodes (DRA claims
// under Volcano).
func volcanoNodeSelectors() []string {
	var out []string
	for _, m := range append(modes.VolcanoModes(), "dra") {
		mode, err := modes.Named(m)
		if err != nil {
			panic(err) // the lab's own modes
		}
		out = append(out, api.LabelNodeConfig+":"+mode.Profile)
	}
	return out
}

// startVolcano installs Volcano's CRDs, its components' identities,
// Tessera's deploy/volcano (the node agents' RBAC, the annotations'
// admission policy) and starts Volcano's scheduler and controller manager.
func startVolcano(ctx context.Context, sup *supervisor.Supervisor, client kubernetes.Interface, d labdir.Dir, p pki.PKI, apiURL string, bins VolcanoBinaries) error {
	if err := apply.Dir(ctx, d.Kubeconfig(), bins.CRDs(), io.Discard); err != nil {
		return fmt.Errorf("applying the CRDs of Volcano: %w", err)
	}
	// The CRDs serve once established; the controllers list them at start.
	gv := schema.GroupVersion{Group: "scheduling.volcano.sh", Version: "v1beta1"}
	if err := poll.Until(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		l, err := client.Discovery().ServerResourcesForGroupVersion(gv.String())
		return err == nil && len(l.APIResources) > 0, nil
	}); err != nil {
		return fmt.Errorf("the CRDs of Volcano not served: %w", err)
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: VolcanoNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	if err := install.Volcano(ctx, client); err != nil {
		return fmt.Errorf("deploy/volcano: %w", err)
	}
	// Volcano's scheduler reads its device configuration once, at start.
	if err := ensureVolcanoDeviceConfig(ctx, client); err != nil {
		return fmt.Errorf("deploy/volcano/device-config.yaml: %w", err)
	}
	kubeconfigs, tokens := map[string]string{}, map[string]string{}
	for _, sa := range []string{VolcanoSchedulerAccount, VolcanoControllerAccount} {
		// The lab gives Volcano's components cluster-admin; Volcano's
		// installer ships narrower roles. Their identities are what the
		// admission policy checks.
		if _, err := client.CoreV1().ServiceAccounts(VolcanoNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "tessera-lab-" + sa},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: VolcanoNamespace, Name: sa}},
		}
		if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		year := int64(365 * 24 * 3600)
		tr, err := client.CoreV1().ServiceAccounts(VolcanoNamespace).CreateToken(ctx, sa,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &year}}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("a token for %s/%s: %w", VolcanoNamespace, sa, err)
		}
		path := filepath.Join(string(d), sa+".kubeconfig")
		if err := p.WriteKubeconfigFor(path, apiURL, sa, tr.Status.Token); err != nil {
			return err
		}
		kubeconfigs[sa] = path
		tokens[sa] = filepath.Join(string(d), sa+".token")
		if err := os.WriteFile(tokens[sa], []byte(tr.Status.Token), 0o600); err != nil {
			return err
		}
	}
	// Each runs as in a pod of the cluster (component.InCluster): Volcano
	// reaches the API server through client-go's in-cluster configuration
	// in places (its vGPU handshake), whatever --kubeconfig says.
	start := func(name, sa, exe string, args []string) error {
		wrapped := append([]string{"--token", tokens[sa], "--ca", p.File("ca.crt"), "--server", apiURL, "--", exe}, args...)
		return sup.Start(name, component.Args(component.InCluster, wrapped...), nil, true)
	}
	conf := filepath.Join(string(d), "volcano-scheduler.conf")
	if err := os.WriteFile(conf, deploy.VolcanoSchedulerConf, 0o644); err != nil {
		return err
	}
	args := []string{
		"--kubeconfig=" + kubeconfigs[VolcanoSchedulerAccount], "--scheduler-conf=" + conf,
		"--leader-elect=false", "--schedule-period=500ms", "--cache-dumper=false", "-v=5",
		// Tessera's DRA shares are consumable capacity (KEP-5075): alpha,
		// off by default, in the Kubernetes 1.34 code Volcano v1.14 links.
		"--feature-gates=DRAConsumableCapacity=true",
	}
	for _, s := range volcanoNodeSelectors() {
		args = append(args, "--node-selector="+s)
	}
	if err := start(VolcanoScheduler, VolcanoSchedulerAccount, bins.Scheduler(), args); err != nil {
		return err
	}
	return start(VolcanoControllerManager, VolcanoControllerAccount, bins.ControllerManager(), []string{
		"--kubeconfig=" + kubeconfigs[VolcanoControllerAccount], "--leader-elect=false", "-v=2",
		// Jobs, PodGroups (one per pod outside a Job), Queues and their
		// collection: the controllers Volcano's scheduling needs (the
		// others' CRDs are not installed).
		"--controllers=job-controller,pg-controller,queue-controller,gc-controller",
	})
}

// ensureVolcanoDeviceConfig creates (or replaces) Volcano's device
// configuration, deploy/volcano/device-config.yaml.
func ensureVolcanoDeviceConfig(ctx context.Context, client kubernetes.Interface) error {
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(deploy.VolcanoDeviceConfig, &cm); err != nil {
		return err
	}
	cms := client.CoreV1().ConfigMaps(cm.Namespace)
	old, err := cms.Get(ctx, cm.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = cms.Create(ctx, &cm, metav1.CreateOptions{})
	case err == nil:
		old.Data = cm.Data
		_, err = cms.Update(ctx, old, metav1.UpdateOptions{})
	}
	return err
}

// waitVolcanoSees waits until Volcano's scheduler has read the GPUs of
// every volcano node with its vGPU sharing on. Volcano v1.14 turns
// deviceshare's VGPUEnable on when its first scheduling session opens and
// builds a node's vGPUs only when it syncs the Node after that: a node
// synced before has none, so deviceshare skips it and Volcano binds a vGPU
// pod there without the grant annotations (its predicates plugin logs the
// failed device allocation and binds anyway), and the node agent refuses
// the pod. What shows that Volcano has the node's vGPUs is the handshake
// it writes when it builds them ("Requesting_<time>", answered by the
// agent's "Reported_" within 20 s); the lab is not ready before that.
// The handshake turns back to "Reported_" within 20 s, so a node seen
// once is not asked again. crashing ends the wait early when a component
// keeps failing; log is the Volcano scheduler's, named in the error.
func waitVolcanoSees(ctx context.Context, client kubernetes.Interface, nodes []modes.NodeSpec, timeout time.Duration, log string, crashing func() error) error {
	var waiting []string
	seen := map[string]bool{}
	err := poll.Until(ctx, timeout, func(ctx context.Context) (bool, error) {
		if err := crashing(); err != nil {
			return false, err
		}
		waiting = waiting[:0]
		for _, n := range nodes {
			if !slices.Contains(modes.VolcanoModes(), n.Mode) || seen[n.Name] {
				continue
			}
			node, err := client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err == nil && strings.HasPrefix(node.Annotations[api.AnnotationVolcanoHandshake], api.VolcanoHandshakeRequesting) {
				seen[n.Name] = true
				continue
			}
			waiting = append(waiting, n.Name)
		}
		return len(waiting) == 0, nil
	})
	if errors.Is(err, poll.ErrTimeout) {
		return fmt.Errorf("volcano's scheduler has not read the vGPUs of node %s (its %s never said %s<time>) %w; see %s",
			strings.Join(waiting, ", "), api.AnnotationVolcanoHandshake, api.VolcanoHandshakeRequesting, err, log)
	}
	return err
}
