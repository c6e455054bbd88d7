//go:build integration

package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/internal/webhook"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// ensureNS creates namespace ns if it is missing.
func (e *env) ensureNS(ns string) {
	e.t.Helper()
	_, err := e.cp.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatal(err)
	}
}

// TestAdmissionHoles plays, through a real API server and the webhook
// registered as shipped, the holes a tenant found in admission; each
// case failed before its fix (each says what it got).
func TestAdmissionHoles(t *testing.T) {
	e := newEnv(t)
	nodes := e.addNodes("a100", 1, 2, "NVIDIA A100-SXM4-40GB", 40960)
	ctx := context.Background()
	const ns = "team-h"
	tenant := e.tenant(ns)
	testenv.WaitFor(t, "webhook to see the inventories", 30*time.Second, func() bool {
		_, err := e.create(fixtures.MakePod().Namespace(gpuNS).Name("probe40").Container("main", map[string]string{names.Memory: "40960"}).Obj())
		return err == nil
	})
	cpu := func(name string) *corev1.Pod {
		return fixtures.MakePod().Namespace(ns).Name(name).Container("main", map[string]string{"cpu": "100m"}).Obj()
	}

	// Before: admitted (the webhook saw only pods asking for GPUs), and
	// on a GPU node the container got every GPU, outside any share.
	t.Run("pod asking no GPU sets NVIDIA_VISIBLE_DEVICES", func(t *testing.T) {
		p := cpu("all-gpus")
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
		_, err := tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		expectDenied(t, err, "spec.containers[0].env[0].name", "NVIDIA_VISIBLE_DEVICES", "asks for no GPU")
		p = cpu("all-gpus-bound")
		p.Spec.NodeName = nodes[0]
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
		_, err = tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		expectDenied(t, err, "NVIDIA_VISIBLE_DEVICES")
	})
	// Before: admitted as written; the ConfigMap's NVIDIA_VISIBLE_DEVICES
	// selected every GPU. Now NVIDIA_VISIBLE_DEVICES=void in env wins.
	t.Run("pod asking no GPU imports variables", func(t *testing.T) {
		if _, err := tenant.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg"}, Data: map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, nodeName := range []string{"", nodes[0]} {
			p := cpu("envfrom-" + fmt.Sprint(nodeName != ""))
			p.Spec.NodeName = nodeName
			p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}}
			var warnings []string
			got, err := withWarnings(t, e, tenantConfig(t, e, ns), &warnings).CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			env := got.Spec.Containers[0].Env
			if len(env) != 1 || env[0] != (corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}) {
				t.Errorf("stored env %v", env)
			}
			if len(warnings) == 0 || !strings.Contains(warnings[0], "NVIDIA_VISIBLE_DEVICES=void") {
				t.Errorf("warnings %q", warnings)
			}
		}
		// A pod that imports nothing and sets nothing never reaches the
		// webhook: admitted while it is down.
	})
	// Before: gpu: 0 was admitted as written, and a kubelet whose plugin
	// offers no device of the resource (MIG, DRA nodes) rejected the pod
	// for good ("no healthy devices present").
	t.Run("gpu 0 stripped", func(t *testing.T) {
		p := fixtures.MakePod().Namespace(ns).Name("zero").Container("main", map[string]string{names.GPU: "0", "cpu": "100m"}).Obj()
		got, err := tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, list := range []corev1.ResourceList{got.Spec.Containers[0].Resources.Limits, got.Spec.Containers[0].Resources.Requests} {
			for n := range list {
				if names.IsGPUResource(string(n)) {
					t.Errorf("stored with %s", n)
				}
			}
		}
		if got.Spec.SchedulerName != corev1.DefaultSchedulerName {
			t.Errorf("sent to %s", got.Spec.SchedulerName)
		}
	})
	// Before: "must be between 0 and 16777216", which did not say how
	// to write 4 GiB.
	t.Run("units in quantity errors", func(t *testing.T) {
		_, err := tenant.CoreV1().Pods(ns).Create(ctx, fixtures.MakePod().Namespace(ns).Name("gi").Container("main", map[string]string{names.Memory: "4Gi"}).Obj(), metav1.CreateOptions{})
		expectDenied(t, err, "limits[nvidia.com/gpumem]", "4Gi", "counts MiB as a plain number", "For 4Gi of memory write 4096")
	})
}

// tenantConfig is the tenant's client configuration in ns (tenant()
// made its rights).
func tenantConfig(t *testing.T, e *env, ns string) *rest.Config {
	t.Helper()
	tr, err := e.cp.Client.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), "tenant", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return e.cp.As(tr.Status.Token)
}

// warningsCollector keeps the API server's warnings.
type warningsCollector struct {
	mu  sync.Mutex
	out *[]string
}

func (w *warningsCollector) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	*w.out = append(*w.out, text)
}

// withWarnings is a client on cfg whose warnings land in out.
func withWarnings(t *testing.T, _ *env, cfg *rest.Config, out *[]string) kubernetes.Interface {
	t.Helper()
	c := rest.CopyConfig(cfg)
	c.WarningHandler = &warningsCollector{out: out}
	client, err := kubernetes.NewForConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// TestMIGQuotaChargesTheInstance: on the dynamic-MIG node, gpumem 1024
// with gpucores 100 was charged 1 GiB against the namespace's GPU memory
// quota but given a 7g.40gb instance (40192 MiB). Now all of a GPU's
// cores are charged a whole GPU, and a share at least the instance its
// cores need: a 10 GiB quota refuses both with Kubernetes' message.
func TestMIGQuotaChargesTheInstance(t *testing.T) {
	e := newEnv(t)
	inv := fixtures.Inventory("mig-00", 1, "NVIDIA A100-SXM4-40GB", 40960, 1)
	inv.GPUs[0].Sharing = api.SharingMIGDynamic
	inv.GPUs[0].SMCount = 108
	inv.GPUs[0].MIG = api.MIG{Capable: true, Enabled: true}
	if _, err := e.cp.Client.CoreV1().Nodes().Create(context.Background(), fixtures.Node("mig-00", inv, names), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "webhook to see the MIG node", 30*time.Second, func() bool {
		p, err := e.cp.Client.CoreV1().Pods(gpuNS).Create(context.Background(), fixtures.MakePod().Namespace(gpuNS).Name("probe").Container("main", map[string]string{names.Memory: "1024", names.Cores: "60"}).Obj(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false
		}
		q := p.Spec.Containers[0].Resources.Requests[webhook.QuotaMemoryResource]
		return q.Value() == 40192<<20
	})
	e.quota("team-m", "gpu-memory", "10Gi")
	for _, res := range []map[string]string{
		{names.Memory: "1024", names.Cores: "100"}, // a whole GPU: 40960 MiB
		{names.Memory: "1024", names.Cores: "60"},  // a 7g.40gb instance: 40192 MiB
	} {
		_, err := e.create(fixtures.MakePod().Namespace("team-m").Name("big").Container("main", res).Obj())
		expectDenied(t, err, "exceeded quota: gpu-memory", "requested: requests.tessera.io/gpu-memory=")
	}
	// A share whose instance fits the quota is admitted, charged the
	// 1g.5gb instance it is given.
	p, err := e.create(fixtures.MakePod().Namespace("team-m").Name("small").Container("main", map[string]string{names.Memory: "1024"}).Obj())
	if err != nil {
		t.Fatal(err)
	}
	if q := p.Spec.Containers[0].Resources.Requests[webhook.QuotaMemoryResource]; q.Value() != 4864<<20 {
		t.Errorf("charged %s, want 4864Mi", q.String())
	}
}

// TestDRAPodsChecked: pods holding GPUs through ResourceClaims skipped
// the env and mount checks. Now held to the rules of GPU pods.
func TestDRAPodsChecked(t *testing.T) {
	e := newEnv(t)
	const ns = "team-d"
	e.ensureNS(ns)
	e.template(ns, "gpu", fixtures.ClaimSpec(api.DeviceClassGPU, "4Gi"))
	for name, mutate := range map[string]func(p *corev1.Pod){
		"env": func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
		},
		"mount above": func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "v", MountPath: "/etc"}}
		},
		"hostPID": func(p *corev1.Pod) { p.Spec.HostPID = true },
	} {
		p := draPod(ns, "dra-"+strings.ReplaceAll(name, " ", "-"), "gpu", "", "main")
		p.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		mutate(p)
		_, err := e.cp.Client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
		expectDenied(t, err, "denied the request")
	}
	if _, err := e.cp.Client.CoreV1().Pods(ns).Create(context.Background(), draPod(ns, "plain", "gpu", "", "main"), metav1.CreateOptions{}); err != nil {
		t.Errorf("a plain DRA pod refused: %v", err)
	}
}

// TestWorkloadTemplatesFractional: nvidia.com/gpu: 0.5 worked in a bare
// pod, but a Deployment (Job, StatefulSet, …) carrying it was refused by
// the API server ("must be an integer"): it validates pod templates after
// mutating admission, and the webhook converted pods only. Reproduced
// first with the templates webhook removed; then every workload kind is
// admitted with its template converted as pods are.
func TestWorkloadTemplatesFractional(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const ns = "team-w"
	e.ensureNS(ns)
	tmpl := func() corev1.PodTemplateSpec {
		p := fixtures.MakePod().Container("main", map[string]string{names.GPU: "0.5"}).Obj()
		p.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
		return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "w"}}, Spec: p.Spec}
	}
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "w"}}
	always := func() corev1.PodTemplateSpec {
		t := tmpl()
		t.Spec.RestartPolicy = corev1.RestartPolicyAlways
		return t
	}
	deploy := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "d"}, Spec: appsv1.DeploymentSpec{Selector: sel, Template: always()}}

	// The hole: without the templates webhook the API server refuses.
	m, err := e.cp.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "tessera-webhook", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hooks := m.Webhooks[:0]
	for _, h := range m.Webhooks {
		if h.Name != "templates.tessera.io" {
			hooks = append(hooks, h)
		}
	}
	m.Webhooks = hooks
	if _, err := e.cp.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, m, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the API server without the templates webhook", 30*time.Second, func() bool {
		_, err := e.cp.Client.AppsV1().Deployments(ns).Create(ctx, deploy, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "must be an integer")
	})
	e.stopWebhook()
	e.startWebhook() // registers its configurations again
	testenv.WaitFor(t, "the templates webhook", 30*time.Second, func() bool {
		_, err := e.cp.Client.AppsV1().Deployments(ns).Create(ctx, deploy, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil
	})

	check := func(kind string, obj runtime.Object, err error, spec corev1.PodSpec) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v", kind, err)
			return
		}
		lim, req := spec.Containers[0].Resources.Limits, spec.Containers[0].Resources.Requests
		for n, want := range map[string]int64{names.GPU: 1, names.MemoryPercentage: 50, names.Cores: 50} {
			l, r := lim[corev1.ResourceName(n)], req[corev1.ResourceName(n)]
			if l.Value() != want || r.Value() != want {
				t.Errorf("%s: %s limit %s request %s, want %d", kind, n, l.String(), r.String(), want)
			}
		}
		_ = obj
	}
	d, err := e.cp.Client.AppsV1().Deployments(ns).Create(ctx, deploy, metav1.CreateOptions{})
	if err == nil {
		check("Deployment", d, err, d.Spec.Template.Spec)
		// kubectl apply of a change: an UPDATE, converted again.
		d.Spec.Template = always()
		d.Spec.Template.Labels["rev"] = "2"
		d.Spec.Selector = sel
		u, err := e.cp.Client.AppsV1().Deployments(ns).Update(ctx, d, metav1.UpdateOptions{})
		if err == nil {
			check("Deployment update", u, err, u.Spec.Template.Spec)
		} else {
			t.Errorf("Deployment update: %v", err)
		}
	} else {
		t.Errorf("Deployment: %v", err)
	}
	s, err := e.cp.Client.AppsV1().StatefulSets(ns).Create(ctx, &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: appsv1.StatefulSetSpec{Selector: sel, Template: always()}}, metav1.CreateOptions{})
	if s != nil {
		check("StatefulSet", s, err, s.Spec.Template.Spec)
	} else {
		t.Errorf("StatefulSet: %v", err)
	}
	ds, err := e.cp.Client.AppsV1().DaemonSets(ns).Create(ctx, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "ds"}, Spec: appsv1.DaemonSetSpec{Selector: sel, Template: always()}}, metav1.CreateOptions{})
	if ds != nil {
		check("DaemonSet", ds, err, ds.Spec.Template.Spec)
	} else {
		t.Errorf("DaemonSet: %v", err)
	}
	rs, err := e.cp.Client.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "rs"}, Spec: appsv1.ReplicaSetSpec{Selector: sel, Template: always()}}, metav1.CreateOptions{})
	if rs != nil {
		check("ReplicaSet", rs, err, rs.Spec.Template.Spec)
	} else {
		t.Errorf("ReplicaSet: %v", err)
	}
	j, err := e.cp.Client.BatchV1().Jobs(ns).Create(ctx, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "j"}, Spec: batchv1.JobSpec{Template: tmpl()}}, metav1.CreateOptions{})
	if j != nil {
		check("Job", j, err, j.Spec.Template.Spec)
	} else {
		t.Errorf("Job: %v", err)
	}
	cj, err := e.cp.Client.BatchV1().CronJobs(ns).Create(ctx, &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "cj"}, Spec: batchv1.CronJobSpec{Schedule: "0 * * * *", JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: tmpl()}}}}, metav1.CreateOptions{})
	if cj != nil {
		check("CronJob", cj, err, cj.Spec.JobTemplate.Spec.Template.Spec)
	} else {
		t.Errorf("CronJob: %v", err)
	}
	// What a template's pods would be refused for is refused at apply,
	// naming the template's field.
	bad := deploy.DeepCopy()
	bad.Name = "bad"
	bad.Spec.Template.Spec.Containers[0].Resources.Limits[corev1.ResourceName(names.GPU)] = resource.MustParse("1.5")
	_, err = e.cp.Client.AppsV1().Deployments(ns).Create(ctx, bad, metav1.CreateOptions{})
	expectDenied(t, err, "Deployment bad: its pods would be refused", "spec.template.spec.containers[0].resources.limits[nvidia.com/gpu]", "1500m")
}

// TestAuditMode: with the webhook in audit mode, a GPU pod with isolation
// findings is admitted with the findings as warnings and a
// TesseraIsolationFinding event; a request the scheduler cannot honour
// is still refused.
func TestAuditMode(t *testing.T) {
	e := newEnv(t)
	e.addNodes("a100", 1, 2, "NVIDIA A100-SXM4-40GB", 40960)
	e.stopWebhook()
	e.startWebhook(func(o *webhook.Options) { o.Audit = true })
	ctx := context.Background()
	p := fixtures.MakePod().Namespace(gpuNS).Name("audited").Container("main", map[string]string{names.GPU: "0.1"}).Obj()
	p.Spec.HostPID = true
	var warnings []string
	got, err := withWarnings(t, e, e.cp.RestConfig, &warnings).CoreV1().Pods(gpuNS).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("refused in audit mode: %v", err)
	}
	if got.Spec.SchedulerName != api.SchedulerName {
		t.Errorf("not mutated: %s", got.Spec.SchedulerName)
	}
	if len(warnings) == 0 || !strings.Contains(strings.Join(warnings, "\n"), "audit mode, would be refused") || !strings.Contains(strings.Join(warnings, "\n"), "spec.hostPID") {
		t.Errorf("warnings %q", warnings)
	}
	var seen []string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := e.cp.Client.CoreV1().Events(gpuNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		seen = nil
		for _, ev := range evs.Items {
			seen = append(seen, ev.InvolvedObject.Kind+"/"+ev.InvolvedObject.Name+" "+ev.Reason+": "+ev.Message)
			if ev.InvolvedObject.Name == "audited" && ev.Reason == webhook.ReasonIsolationFinding && strings.Contains(ev.Message, "spec.hostPID") {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s event on the pod: %v; events: %q", webhook.ReasonIsolationFinding, err, seen)
	}
	_, err = e.create(fixtures.MakePod().Namespace(gpuNS).Name("cores").Container("main", map[string]string{names.Cores: "101"}).Obj())
	expectDenied(t, err, "between 0 and 100")
}
