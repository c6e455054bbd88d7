//go:build integration

// Package integration runs Tessera's scheduler and webhook against a real
// kube-apiserver and etcd (internal/testenv). Run with
//
//	go test -tags integration -count=1 ./test/integration/
package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/install"
	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/scheduler"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/internal/webhook"
	"github.com/tessera-gpu/tessera/pkg/api"
)

var names = api.DefaultResourceNames

const gpuNS = "gpu"

// env is a control plane with Tessera's webhook registered over TLS and
// handles to start and stop the scheduler. As in a cluster, the API server
// authorizes by RBAC, the scheduler runs under its own ServiceAccount with
// the RBAC of deploy/scheduler, and the record policy of
// deploy/admission/policy.yaml is in force: only the scheduler may write
// allocation records. (The tests write Nodes and their inventories as the
// admin, playing the node agents, so the inventory policy is unbound.)
type env struct {
	t  *testing.T
	cp *testenv.ControlPlane

	stopWebhook func()
	schedConfig string
	// schedKubeconfig is the scheduler's kubeconfig (its ServiceAccount).
	schedKubeconfig string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	start := time.Now()
	e := &env{t: t, cp: testenv.StartControlPlane(t, testenv.Options{APIServerFlags: []string{"--authorization-mode=RBAC"}})}
	t.Logf("control plane up in %v", time.Since(start).Round(time.Millisecond))
	ctx := context.Background()
	if err := install.Identities(ctx, e.cp.Client, false); err != nil {
		t.Fatal(err)
	}
	// The tests play the node agents (they write Nodes with inventories
	// as the admin): the inventory policy is for the lab and clusters.
	if err := e.cp.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, webhook.InventoryPolicyName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	probe := fixtures.Node("probe", fixtures.Inventory("probe", 1, "A100", 40960, 1), names)
	testenv.WaitFor(t, "the inventory policy unbound", time.Minute, func() bool {
		_, err := e.cp.Client.CoreV1().Nodes().Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil
	})
	token, err := install.Token(ctx, e.cp.Client, install.SchedulerAccount)
	if err != nil {
		t.Fatal(err)
	}
	e.schedKubeconfig = e.cp.KubeconfigAs(t, "scheduler.kubeconfig", token)
	if _, err := e.cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: gpuNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.startWebhook()
	e.schedConfig = e.writeSchedulerConfig()
	return e
}

// startWebhook runs the webhook on a loopback port and waits until the API
// server sends GPU pods to it; with changes applied to its options.
func (e *env) startWebhook(changes ...func(o *webhook.Options)) {
	t := e.t
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	o := webhook.Options{
		Client:        e.cp.Client,
		Names:         names,
		SchedulerName: api.SchedulerName,
		Listen:        "127.0.0.1:0",
		Hosts:         []string{"127.0.0.1"},
		Register:      true,
		Registration:  webhook.Registration{Name: "tessera-webhook"},
	}
	for _, c := range changes {
		c(&o)
	}
	go func() {
		done <- webhook.Run(ctx, o)
	}()
	e.stopWebhook = func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("webhook: %v", err)
		}
	}
	t.Cleanup(func() {
		if ctx.Err() == nil {
			e.stopWebhook()
		}
	})
	// The API server picks up new webhook configurations asynchronously.
	probe := fixtures.MakePod().Namespace(gpuNS).Name("probe").Container("c", map[string]string{names.GPU: "0.5"}).Obj()
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := e.cp.Client.CoreV1().Pods(gpuNS).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && p.Spec.SchedulerName == api.SchedulerName, nil
	})
	if err != nil {
		t.Fatalf("webhook never took effect: %v", err)
	}
}

// writeSchedulerConfig is deploy/scheduler/config.yaml, the shipped
// configuration, pointed at the test's API server without leader election.
// A modest client rate keeps a 500-pod run a few seconds long, so a
// scheduler killed "in the middle" really is. Its placementPolicy is
// binpack, the policy expectPlacement
// re-derives every placement with: the shipped policy learns the workload
// online from every pod it sees, which a placement-by-placement check
// cannot replay. (TestEveryPolicyStarts runs every policy through this
// configuration; BenchmarkReplay compares the shipped one with the
// simulator.)
func (e *env) writeSchedulerConfig() string {
	return e.schedulerConfig("scheduler.yaml", nil)
}

// schedulerConfig writes that configuration (placementPolicy binpack, see
// writeSchedulerConfig), changed by mutate (if not nil), to a file of
// the given name and returns its path.
func (e *env) schedulerConfig(name string, mutate func(cfg map[string]any)) string {
	t := e.t
	t.Helper()
	out, err := deploy.SchedulerConfigFor(e.schedKubeconfig, 200, 200)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	for _, prof := range cfg["profiles"].([]any) {
		for _, pc := range prof.(map[string]any)["pluginConfig"].([]any) {
			if pc := pc.(map[string]any); pc["name"] == scheduler.Name {
				pc["args"].(map[string]any)["placementPolicy"] = string(api.NodeBinpack)
			}
		}
	}
	if mutate != nil {
		mutate(cfg)
	}
	if out, err = yaml.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startScheduler runs a scheduler in the process; the returned function
// kills it (cancels it and waits until it has stopped).
func (e *env) startScheduler() (stop func()) { return e.startSchedulerWith(e.schedConfig) }

// startSchedulerWith is startScheduler from the configuration file
// config, with extra kube-scheduler options (a test's own plugins).
func (e *env) startSchedulerWith(config string, extra ...app.Option) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- scheduler.RunInProcess(ctx, config, scheduler.WithSchedulerOptions(extra...)) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				e.t.Errorf("scheduler: %v", err)
			}
		case <-time.After(30 * time.Second):
			e.t.Errorf("scheduler did not stop within 30s")
		}
	}
	e.t.Cleanup(stop)
	return stop
}

func (e *env) addNodes(prefix string, count, gpus int, model string, memMiB int64) []string {
	var out []string
	for i := range count {
		name := fmt.Sprintf("%s-%02d", prefix, i)
		n := fixtures.Node(name, fixtures.Inventory(name, gpus, model, memMiB, 10), names)
		if _, err := e.cp.Client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, name)
	}
	return out
}

func (e *env) create(p *corev1.Pod) (*corev1.Pod, error) {
	if p.Namespace == "" {
		p.Namespace = gpuNS
	}
	return e.cp.Client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
}

// waitBound waits until the pod is bound and returns it with its record.
func (e *env) waitBound(name string) (*corev1.Pod, *api.PodAllocation) {
	e.t.Helper()
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := e.cp.Client.CoreV1().Pods(gpuNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		return p.Spec.NodeName != "", nil
	})
	if err != nil {
		e.t.Fatalf("pod %s not bound: %v (conditions %+v)", name, err, pod.Status.Conditions)
	}
	rec, err := api.DecodeAllocation([]byte(pod.Annotations[api.AnnotationAllocation]))
	if err != nil {
		e.t.Fatalf("pod %s bound without a valid record: %v", name, err)
	}
	if rec.Node != pod.Spec.NodeName {
		e.t.Fatalf("pod %s bound to %s, record says %s", name, pod.Spec.NodeName, rec.Node)
	}
	return pod, rec
}

// published reads what the API server holds: node inventories and the
// records of bound pods.
func (e *env) published() (map[string]*api.NodeInventory, map[string]*api.PodAllocation, []corev1.Pod) {
	e.t.Helper()
	ctx := context.Background()
	nodes, err := e.cp.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	invs := map[string]*api.NodeInventory{}
	for _, n := range nodes.Items {
		inv, err := api.DecodeInventory([]byte(n.Annotations[api.AnnotationInventory]))
		if err != nil {
			e.t.Fatalf("node %s: %v", n.Name, err)
		}
		invs[n.Name] = inv
	}
	pods, err := e.cp.Client.CoreV1().Pods(gpuNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	recs := map[string]*api.PodAllocation{}
	for _, p := range pods.Items {
		if p.Spec.NodeName == "" {
			continue
		}
		raw, ok := p.Annotations[api.AnnotationAllocation]
		if !ok {
			e.t.Errorf("pod %s bound to %s without an allocation record", p.Name, p.Spec.NodeName)
			continue
		}
		rec, err := api.DecodeAllocation([]byte(raw))
		if err != nil {
			e.t.Errorf("pod %s: %v", p.Name, err)
			continue
		}
		recs[p.Namespace+"/"+p.Name] = rec
	}
	return invs, recs, pods.Items
}

// checkInvariant runs the placement core's invariant checker over what the
// API server holds.
func (e *env) checkInvariant() int {
	e.t.Helper()
	invs, recs, _ := e.published()
	if err := placement.CheckRecords(invs, recs); err != nil {
		e.t.Fatalf("invariant broken over %d records: %v", len(recs), err)
	}
	return len(recs)
}

func expectDenied(t *testing.T, err error, wants ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("accepted, want rejection mentioning %q", wants)
		return
	}
	if !apierrors.IsInvalid(err) && !apierrors.IsBadRequest(err) && !strings.Contains(err.Error(), "denied the request") {
		t.Logf("error type: %T %v", err, err)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("API server answer %q does not mention %q", err.Error(), w)
		}
	}
}
