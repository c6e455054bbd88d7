package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	k8sversion "k8s.io/component-base/version"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/install"
	"github.com/tessera-gpu/tessera/internal/lab/component"
	"github.com/tessera-gpu/tessera/internal/lab/etcd"
	"github.com/tessera-gpu/tessera/internal/lab/modes"
	"github.com/tessera-gpu/tessera/internal/lab/pki"
	"github.com/tessera-gpu/tessera/internal/lab/poll"
	"github.com/tessera-gpu/tessera/internal/lab/supervisor"
	"github.com/tessera-gpu/tessera/internal/lab/tools"
	"github.com/tessera-gpu/tessera/internal/lab/volumes"
	"github.com/tessera-gpu/tessera/internal/nodeagent/config"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// controllers are the kube-controller-manager controllers the lab runs:
// what a user's Deployments, StatefulSets, DaemonSets, Jobs and CronJobs
// need and the collectors behind them; the resource-quota controller (a
// ResourceQuota shows usage, and the API server admits pods against it);
// the resource-claim controller (claims from a pod's ResourceClaimTemplates,
// for DRA); the PersistentVolume controllers (binding claims to the
// volumes the lab's provisioner makes, package volumes; the protection of
// volumes in use; claims from a pod's ephemeral volumes). Not run: the
// node lifecycle (no node ever goes NotReady from the control plane's
// side), service accounts and their tokens (pods get none), endpoints
// (containers have no network), attaching volumes and certificates.
var controllers = []string{
	"deployment-controller", "replicaset-controller", "statefulset-controller", "daemonset-controller",
	"job-controller", "cronjob-controller", "ttl-after-finished-controller",
	"garbage-collector-controller", "namespace-controller", "pod-garbage-collector-controller",
	"resourcequota-controller", "resourceclaim-controller",
	"persistentvolume-binder-controller", "persistentvolume-protection-controller",
	"persistentvolumeclaim-protection-controller", "ephemeral-volume-controller",
}

// Up starts the lab, calls ready once every component serves, and runs
// until ctx ends; then it stops every component and leaves the state
// directory for `tessera-lab down` (or another Up) to take.
func Up(ctx context.Context, cfg Config, ready func(*State, kubernetes.Interface)) error {
	logger := klog.FromContext(ctx).WithName("lab")
	d := cfg.Dir
	out := cfg.Out
	if out == nil {
		out = io.Discard
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 3 * time.Minute
	}
	if cfg.Tools == "" {
		cfg.Tools = tools.Dir(tools.Default())
	}
	if !filepath.IsAbs(string(cfg.Tools)) {
		return fmt.Errorf("tools directory %q: want an absolute path", cfg.Tools)
	}
	if err := cfg.Tools.Check(); err != nil {
		return err
	}
	if v := k8sversion.Get().GitVersion; strings.HasPrefix(v, "v0.0.0") {
		fmt.Fprintf(out, "warning: tessera-lab was built without the Kubernetes version (it reports %q): kubectl version and clients that check the server's version fail; build it with `make lab` (the flags of internal/version.KubernetesLDFlags)\n", v)
	}
	if old, err := ReadState(d); err == nil && old.Alive() {
		return fmt.Errorf("a lab already runs in %s (pid %d); stop it with `tessera-lab down --dir %s` or pick another --dir", d, old.PID, d)
	}
	for _, p := range []string{d.Logs(), d.PKI()} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
	}
	start := time.Now()
	step := func(format string, args ...any) {
		fmt.Fprintf(out, "[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	p, err := pki.Ensure(d.PKI())
	if err != nil {
		return fmt.Errorf("credentials: %w", err)
	}
	etcdURL, stopEtcd, err := etcd.Start(d.Etcd())
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer stopEtcd()
	step("etcd serving at %s", etcdURL)

	ports, err := freePorts(2 + len(cfg.Nodes))
	if err != nil {
		return err
	}
	apiURL := fmt.Sprintf("https://127.0.0.1:%d", ports[0])
	if err := p.WriteKubeconfig(d.Kubeconfig(), apiURL); err != nil {
		return err
	}
	state := &State{PID: os.Getpid(), Started: start, APIServer: apiURL, Kubeconfig: d.Kubeconfig(), Nodes: cfg.Nodes}
	var stateMu sync.Mutex
	var sup *supervisor.Supervisor
	save := func(mutate func(*State)) {
		stateMu.Lock()
		defer stateMu.Unlock()
		if mutate != nil {
			mutate(state)
		}
		if sup != nil {
			state.Components = sup.Components()
		}
		if err := writeState(d, state); err != nil {
			logger.Error(err, "Writing the lab state")
		}
	}
	sup = supervisor.New(cfg.Exe, d.Log, logger, func() { go save(nil) })
	defer func() {
		sup.StopAll(5 * time.Second)
		save(func(s *State) { s.Ready, s.Stopped = false, true })
	}()
	save(nil)

	client, err := startAPIServer(ctx, sup, d, p, apiServerFlags{etcdURL: etcdURL, address: "127.0.0.1", port: ports[0]})
	if err != nil {
		return err
	}
	step("kube-apiserver serving at %s", apiURL)
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: install.Namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	ids, err := setUpIdentities(ctx, client, d, p, apiURL)
	if err != nil {
		return fmt.Errorf("identities and admission policies: %w", err)
	}
	step("scheduler and node agents have their own identities; admission policies in force")
	profiles, err := modes.EnsureConfigMap(ctx, client, cfg.NodeConfig, cfg.Nodes)
	if err != nil {
		return err
	}

	schedConfig, err := writeSchedulerConfig(d.SchedulerConfig(), ids.Scheduler)
	if err != nil {
		return err
	}
	if err := startControllerManager(sup, d, controllers); err != nil {
		return err
	}
	if err := sup.Start(component.Webhook, component.WebhookArgs(d.Kubeconfig(), fmt.Sprintf("127.0.0.1:%d", ports[1])), nil, false); err != nil {
		return err
	}
	if err := volumes.EnsureStorageClass(ctx, client); err != nil {
		return fmt.Errorf("the lab's StorageClass: %w", err)
	}
	if err := sup.Start(component.VolumeProvisioner, component.VolumeProvisionerArgs(d.Kubeconfig(), d), nil, false); err != nil {
		return err
	}
	if err := sup.Start(component.Scheduler, component.Args(component.Scheduler, "--config="+schedConfig, "--secure-port=0"), nil, false); err != nil {
		return err
	}
	if err := modes.SetUp(ctx, client, cfg.Nodes); err != nil {
		return err
	}
	if cfg.Volcano != "" {
		if err := cfg.Volcano.Check(); err != nil {
			return err
		}
		if err := startVolcano(ctx, sup, client, d, p, apiURL, cfg.Volcano); err != nil {
			return fmt.Errorf("starting Volcano: %w", err)
		}
		step("Volcano %s: scheduler and controller manager started", cfg.Volcano.Version())
	}
	for i, n := range cfg.Nodes {
		if err := startNode(sup, d, cfg.Tools, n, ids.NodeAgent, ports[2+i]); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	step("started kube-controller-manager, scheduler, webhook, volume provisioner and %d emulated GPU nodes", len(cfg.Nodes))

	crashing := func() error {
		for name, c := range sup.Components() {
			if c.Restarts >= 3 {
				return fmt.Errorf("%s keeps exiting (%d restarts); see %s", name, c.Restarts, d.Log(name))
			}
		}
		return nil
	}
	if err := waitReady(ctx, client, cfg.Nodes, profiles, cfg.ReadyTimeout, crashing); err != nil {
		return fmt.Errorf("%w (logs in %s)", err, d.Logs())
	}
	if cfg.Volcano != "" {
		if err := waitVolcanoSees(ctx, client, cfg.Nodes, cfg.ReadyTimeout, d.Log(VolcanoScheduler), crashing); err != nil {
			return err
		}
	}
	step("ready: webhook admitting, %d nodes Ready with their GPUs", len(cfg.Nodes))
	save(func(s *State) { s.Ready = true })
	if ready != nil {
		ready(state, client)
	}
	<-ctx.Done()
	fmt.Fprintln(out, "stopping the lab…")
	return nil
}

// DefaultScheduler is the profile that places the pods Tessera does not
// (CPU-only pods, DaemonSets, DRA claims), as a cluster's kube-scheduler does.
const DefaultScheduler = corev1.DefaultSchedulerName

// writeSchedulerConfig writes the shipped scheduler configuration pointed
// at the lab, with kube-scheduler's default profile beside Tessera's: one
// scheduler, one cache, so the two never place pods on the same free
// resources at once.
func writeSchedulerConfig(path, kubeconfig string) (string, error) {
	out, err := deploy.SchedulerConfigFor(kubeconfig, 200, 400)
	if err != nil {
		return "", err
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(out, &cfg); err != nil {
		return "", err
	}
	profiles, _ := cfg["profiles"].([]any)
	cfg["profiles"] = append(profiles, map[string]any{"schedulerName": DefaultScheduler})
	if out, err = yaml.Marshal(cfg); err != nil {
		return "", err
	}
	return path, os.WriteFile(path, out, 0o644)
}

// waitReady waits until the webhook routes GPU pods to Tessera's scheduler
// and every node is Ready with its inventory and GPU slots published.
// crashing, polled meanwhile, ends the wait early when a component keeps
// failing (no root, a port taken, …).
func waitReady(ctx context.Context, client kubernetes.Interface, nodes []modes.NodeSpec, profiles map[string]config.Node, timeout time.Duration, crashing func() error) error {
	// Half a GPU: the webhook must route it to Tessera (a dry run, so
	// nothing is created).
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "tessera-lab-probe"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "c", Image: "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				corev1.ResourceName(api.DefaultResourceNames.GPU): resource.MustParse("0.5"),
			}},
		}}},
	}
	var missing []string
	err := poll.Until(ctx, timeout, func(ctx context.Context) (bool, error) {
		if err := crashing(); err != nil {
			return false, err
		}
		missing = missing[:0]
		p, err := client.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil || p.Spec.SchedulerName != api.SchedulerName {
			missing = append(missing, "webhook")
		}
		for _, n := range nodes {
			if !modes.NodeReady(ctx, client, n, profiles[n.Name]) {
				missing = append(missing, "node "+n.Name)
			}
		}
		return len(missing) == 0, nil
	})
	if errors.Is(err, poll.ErrTimeout) {
		return fmt.Errorf("not ready after %v: waiting for %s", timeout, strings.Join(missing, ", "))
	}
	return err
}

func freePorts(n int) ([]int, error) {
	var out []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}
