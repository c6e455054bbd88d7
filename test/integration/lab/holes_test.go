//go:build integration

package lab_test

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/install"
	"github.com/tessera-gpu/tessera/internal/lab/modes"
	"github.com/tessera-gpu/tessera/internal/nodeagent/reconcile"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/internal/webhook"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// The holes of the admission issue, each as a tenant reproduced it on the
// lab (an ordinary namespace with edit rights, the default lab), and what
// the lab shows now: the tenant refused, or the pod running with what it
// was granted and nothing more. The host-side reconciler's part (the
// limiter's state removed, a process without the limiter, GPUs taken by
// a pod that asks none) is TestReconcilerInTheLab's.

// refusedWith creates the pod as the tenant and requires a refusal naming
// every want.
func refusedWith(t *testing.T, tenant kubernetes.Interface, p *corev1.Pod, want ...string) {
	t.Helper()
	_, err := tenant.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err == nil {
		t.Fatalf("pod %s admitted, want a refusal naming %q", p.Name, want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("pod %s refused with %q, want it to name %q", p.Name, err, w)
		}
	}
}

// noGPUPod is a pod that asks for no GPU.
func noGPUPod(ns, name string) *corev1.Pod {
	return fixtures.MakePod().Namespace(ns).Name(name).ZeroTerminationGracePeriod().Container("c", nil).Obj()
}

func TestAdmissionHolesOnTheLab(t *testing.T) {
	ctx := context.Background()
	const ns = "holes"
	tenant := tenantClient(t, ns)
	cleanWorkloads(t, ns)

	// Before: every GPU of its node, no limiter, no limits file; a
	// neighbour granted 16 GiB on one of them got 0 MiB.
	t.Run("pod asking no GPU selects every GPU", func(t *testing.T) {
		p := noGPUPod(ns, "all-env")
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: api.EnvVisibleDevices, Value: "all"}}
		refusedWith(t, tenant, p, api.EnvVisibleDevices)
		p = noGPUPod(ns, "all-nodename")
		p.Spec.NodeName = victimNode
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: api.EnvVisibleDevices, Value: "all"}}
		refusedWith(t, tenant, p, api.EnvVisibleDevices)
		// Through a ConfigMap: admitted, the variable voided; the
		// runtime gives it no GPU.
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{api.EnvVisibleDevices: "all"}}
		if _, err := tenant.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p = noGPUPod(ns, "all-envfrom")
		p.Spec.NodeName = victimNode
		p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}}
		if _, err := tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitRunning(t, ns, p.Name)
		c, err := dir.Node(victimNode).Container(ns, p.Name, "c")
		if err != nil {
			t.Fatal(err)
		}
		if len(c.GPUs) != 0 || c.Env[api.EnvVisibleDevices] != api.EnvVoidDevices {
			t.Errorf("the envFrom pod was given GPUs %v (%s=%q)", c.GPUs, api.EnvVisibleDevices, c.Env[api.EnvVisibleDevices])
		}
	})

	// Before: an emptyDir at /etc hid the preload list and the limits
	// file; the container held 40960 MiB against a 4096 MiB record.
	t.Run("mount above the agent's paths", func(t *testing.T) {
		p := fixtures.MakePod().Namespace(ns).Name("etc").ZeroTerminationGracePeriod().Container("c", map[string]string{names.GPU: "0.1"}).Obj()
		p.Spec.Volumes = []corev1.Volume{{Name: "etc", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "etc", MountPath: "/etc"}}
		refusedWith(t, tenant, p, `"/etc" is above /etc/ld.so.preload`)
	})

	// Before: gpumem 1024 with gpucores 100 was charged 1 GiB of the GPU
	// memory quota and given a 7g.40gb instance.
	t.Run("dynamic-MIG quota charges the instance", func(t *testing.T) {
		q := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "gpu-memory"}, Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{
			corev1.ResourceName("requests." + webhook.QuotaMemoryResource): resource.MustParse("10Gi"),
		}}}
		if _, err := client.CoreV1().ResourceQuotas(ns).Create(ctx, q, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = client.CoreV1().ResourceQuotas(ns).Delete(ctx, q.Name, metav1.DeleteOptions{}) })
		testenv.WaitFor(t, "the quota's usage computed", time.Minute, func() bool {
			got, err := client.CoreV1().ResourceQuotas(ns).Get(ctx, q.Name, metav1.GetOptions{})
			return err == nil && got.Status.Hard != nil
		})
		refusedWith(t, tenant, dynamicPod(ns, "whole-cores", map[string]string{names.GPU: "1", names.Memory: "1024", names.Cores: "100"}),
			"exceeded quota: gpu-memory", "requested: requests."+webhook.QuotaMemoryResource)
		// A share whose instance fits: charged the instance it is given.
		p := dynamicPod(ns, "small", map[string]string{names.GPU: "1", names.Memory: "1024"})
		if _, err := tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		r := waitRunning(t, ns, "small")
		g := record(t, r).Containers[0].Devices[0]
		charged := r.Spec.Containers[0].Resources.Requests[corev1.ResourceName(webhook.QuotaMemoryResource)]
		if g.MIG == nil || g.MIG.Profile != "1g.5gb" || charged.Value() != 4864<<20 {
			t.Errorf("given %+v, charged %s; want the 1g.5gb instance (4864 MiB) and its memory charged", g.MIG, charged.String())
		}
	})

	// Before: a DRA pod skipped the env and mount checks.
	t.Run("DRA pods under the same rules", func(t *testing.T) {
		apply(t, `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {namespace: holes, name: share}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.tessera.io
          capacity:
            requests: {memory: 4Gi}
`)
		dra := func(name string) *corev1.Pod {
			p := noGPUPod(ns, name)
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: new("share")}}
			p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
			return p
		}
		p := dra("dra-env")
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: api.EnvVisibleDevices, Value: "all"}}
		refusedWith(t, tenant, p, api.EnvVisibleDevices)
		p = dra("dra-etc")
		p.Spec.Volumes = []corev1.Volume{{Name: "etc", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "etc", MountPath: "/etc"}}
		refusedWith(t, tenant, p, `"/etc" is above /etc/ld.so.preload`)
	})

	// Before: the kubelets of the MIG and DRA nodes, which offer no
	// nvidia.com/gpu device, rejected such pods for good ("no healthy
	// devices present").
	t.Run("gpu 0 on the MIG and DRA nodes", func(t *testing.T) {
		for _, node := range []string{"lab-mig", "lab-mig-dynamic", draNode} {
			p := fixtures.MakePod().Namespace(ns).Name("zero-"+node).ZeroTerminationGracePeriod().Container("c", map[string]string{names.GPU: "0"}).Obj()
			p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
			p.Spec.Tolerations = []corev1.Toleration{{Key: modes.SharingTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
			got, err := tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := got.Spec.Containers[0].Resources.Limits[corev1.ResourceName(names.GPU)]; ok {
				t.Errorf("%s: nvidia.com/gpu 0 kept: %v", p.Name, got.Spec.Containers[0].Resources)
			}
			if r := waitRunning(t, ns, p.Name); r.Spec.NodeName != node {
				t.Errorf("%s runs on %s", p.Name, r.Spec.NodeName)
			}
		}
	})

	// Before: "must be between 0 and 16777216", without the unit.
	t.Run("units in quantity errors", func(t *testing.T) {
		p := fixtures.MakePod().Namespace(ns).Name("gi").Container("c", map[string]string{names.Memory: "4Gi"}).Obj()
		refusedWith(t, tenant, p, names.Memory, "MiB")
	})

	// Before: the API server refused the template ("must be an
	// integer"): the webhook converted pods only.
	t.Run("a Deployment of half GPUs runs", func(t *testing.T) {
		tmpl := fixtures.MakePod().Namespace(ns).Name("half").ZeroTerminationGracePeriod().Container("c", map[string]string{names.GPU: "0.5"}).Obj()
		tmpl.Labels = map[string]string{"app": "half"}
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "half", Namespace: ns}, Spec: appsv1.DeploymentSpec{
			Replicas: new(int32(2)), Selector: &metav1.LabelSelector{MatchLabels: tmpl.Labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: tmpl.Labels}, Spec: tmpl.Spec},
		}}
		if _, err := client.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatalf("refused: %v", err)
		}
		var pods []corev1.Pod
		testenv.WaitFor(t, "the Deployment's 2 pods running", 2*time.Minute, func() bool {
			l, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=half"})
			pods = l.Items
			return err == nil && len(pods) == 2 && pods[0].Status.Phase == corev1.PodRunning && pods[1].Status.Phase == corev1.PodRunning
		})
		for i := range pods {
			g := record(t, &pods[i]).Containers[0].Devices[0]
			if g.MemoryMiB != 20480 || g.Cores != 50 {
				t.Errorf("%s: grant %+v, want half an A100-40GB", pods[i].Name, g)
			}
		}
	})
}

// TestReconcilerInTheLab: the node agents' host-side reconciler runs in
// the lab (the runtime puts each container in a cgroup named after its
// pod and container) and answers what the limiter cannot see: a 0.1 share
// that removes its limiter state between processes, a process that never
// loaded the limiter, and a pod that asks no GPU but took them all (in a
// namespace the webhook trusts). Each: a Warning event, the breach
// counter, the container's processes killed (its pod fails, exit 137).
// In a namespace the reconciler exempts too, the same pod is what the
// physical check and `tessera-lab status` count as GPU memory held
// without a valid grant.
func TestReconcilerInTheLab(t *testing.T) {
	ctx := context.Background()
	const ns = "reconcile"
	useNamespace(t, ns)
	share := func(name, script string) *corev1.Pod {
		p := fixtures.MakePod().Namespace(ns).Name(name).ZeroTerminationGracePeriod().Container("c", map[string]string{names.GPU: "0.1"}).Obj()
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
		p.Spec.Containers[0].Command = []string{"sh", "-c", script}
		return p
	}
	// Ten processes of 4064 MiB each (the 4096 MiB share less the
	// limiter's context), the state each registered in removed before
	// the next starts: each sees the whole share.
	stateless := share("stateless", `for i in 1 2 3 4 5 6 7 8 9 10; do
  rm -f `+api.ContainerStateDir+`/*
  gpu-fill --hold forever > /tmp/p$i.log 2>&1 &
  until grep -q holding /tmp/p$i.log; do sleep 0.05; done
  echo "process $i: $(grep 'in total' /tmp/p$i.log | tail -1)"
done
sleep 3600`)
	// A loader that ignores /etc/ld.so.preload: here, the preload list
	// hidden in a mount namespace of the process's own (the lab's
	// containers keep root's capabilities; a cluster's do not).
	unlimited := share("unregistered", `unshare --mount sh -c 'mount --bind /dev/null /etc/ld.so.preload && exec gpu-fill --max 1024 --hold forever'`)
	// A pod asking no GPU that selects them all, in a namespace the
	// webhook trusts (a monitoring agent's, say).
	trustedNS := "reconcile-trusted"
	useNamespace(t, trustedNS)
	if _, err := client.CoreV1().Namespaces().Patch(ctx, trustedNS, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"`+webhook.TrustedLabel+`":"true"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	taker := func(ns string) *corev1.Pod {
		p := noGPUPod(ns, "taker")
		p.Spec.NodeName = victimNode
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
		p.Spec.Containers[0].Command = []string{"gpu-fill", "--max", "2048", "--hold", "forever"}
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: api.EnvVisibleDevices, Value: "all"}}
		return p
	}
	for _, c := range []struct {
		pod    *corev1.Pod
		reason string
	}{
		{stateless, reconcile.ReasonOverGrant},
		{unlimited, reconcile.ReasonWithoutLimiter},
		{taker(trustedNS), reconcile.ReasonNotGranted},
	} {
		p := c.pod
		if _, err := client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		got := waitPod(t, p.Namespace, p.Name, 2*time.Minute, phase(corev1.PodFailed, corev1.PodSucceeded))
		var exit int32 = -1
		for _, s := range got.Status.ContainerStatuses {
			if s.State.Terminated != nil {
				exit = s.State.Terminated.ExitCode
			}
		}
		if got.Status.Phase != corev1.PodFailed || exit != 137 {
			t.Errorf("%s: %s, exit code %d; want its processes killed (137)", p.Name, got.Status.Phase, exit)
		}
		var events []string
		testenv.WaitFor(t, p.Name+"'s "+c.reason+" event", time.Minute, func() bool {
			events = eventsOf(t, p.Namespace, p.Name)
			return slices.ContainsFunc(events, func(e string) bool { return strings.HasPrefix(e, c.reason+": ") })
		})
		for _, e := range events {
			if strings.HasPrefix(e, c.reason) {
				t.Logf("%s: %s", p.Name, e)
				if !strings.Contains(e, "killed its processes") {
					t.Errorf("%s: %s", p.Name, e)
				}
			}
		}
		url, err := dir.MetricsURL(got.Spec.NodeName)
		if err != nil {
			t.Fatal(err)
		}
		if m := findSeries(scrapeMetrics(t, url), "tessera_node_agent_grant_breaches_total", map[string]string{"reason": c.reason}); m == nil || m.GetCounter().GetValue() < 1 {
			t.Errorf("%s: tessera_node_agent_grant_breaches_total{reason=%q} = %v", p.Name, c.reason, m)
		}
		if p.Name == "stateless" {
			log := logsContain(t, ns, p.Name, "process 1:")
			t.Logf("kubectl logs stateless:\n%s", log)
		}
	}

	// Where neither the webhook nor the reconciler looks (tessera-system,
	// the agents' own namespace): the physical check, and the status
	// line, count what the pod holds without a grant.
	p := taker(install.Namespace)
	p.Name = "lab-test-taker"
	if _, err := client.CoreV1().Pods(install.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Pods(install.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		testenv.WaitFor(t, p.Name+" gone", time.Minute, func() bool {
			_, err := client.CoreV1().Pods(install.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			return err != nil
		})
	})
	logsContain(t, install.Namespace, p.Name, "holding")
	ph := checkPhysical(t)
	if ph.UngrantedMiB() != 2048 || !strings.Contains(fmt.Sprint(ph.Err()), install.Namespace+"/"+p.Name+"/c holds 2048 MiB") {
		t.Errorf("the physical check counts %d MiB without a grant: %v", ph.UngrantedMiB(), ph.Err())
	}
	out, err := exec.Command(labBin, "status", "--dir", string(dir)).CombinedOutput()
	if err != nil {
		t.Fatalf("tessera-lab status: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "PHYSICAL CHECK BROKEN (2048 MiB of GPU memory held without a valid grant)") {
		t.Errorf("tessera-lab status:\n%s", out)
	}
}
