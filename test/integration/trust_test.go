//go:build integration

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/internal/webhook"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// waitRecord waits until the pod is bound and returns its record.
func waitRecord(t *testing.T, e *env, ns, name string) *api.PodAllocation {
	t.Helper()
	var rec *api.PodAllocation
	testenv.WaitFor(t, name+" bound with a record", 60*time.Second, func() bool {
		p, err := e.cp.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil || p.Spec.NodeName == "" {
			return false
		}
		rec, err = api.DecodeAllocation([]byte(p.Annotations[api.AnnotationAllocation]))
		return err == nil
	})
	return rec
}

// tenant is a user with ordinary namespace rights in ns (what the
// aggregated edit role grants on pods and config; no controller manager
// runs here to aggregate it), plus pods/binding, pods/status and
// ephemeral containers, which the trust issue's attacker had.
func (e *env) tenant(ns string) kubernetes.Interface {
	t := e.t
	ctx := context.Background()
	c := e.cp.Client
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sa := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "tenant", Namespace: ns}}
	if _, err := c.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "tenant"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "configmaps", "secrets"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"pods/binding", "pods/status", "pods/ephemeralcontainers"}, Verbs: []string{"create", "update", "patch"}},
		}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "tenant"},
		RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "tenant"}, Subjects: sa}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "tenant", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(e.cp.As(tr.Status.Token))
	if err != nil {
		t.Fatal(err)
	}
	// RBAC bindings take effect asynchronously.
	testenv.WaitFor(t, "the tenant's rights", 30*time.Second, func() bool {
		_, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil
	})
	return client
}

// forged is the record the attacker writes: the whole of an A100 for a
// 0.1-GPU pod, unthrottled.
func forged(node, uuid string) string {
	b, err := api.EncodeAllocation(&api.PodAllocation{Node: node, Containers: []api.ContainerAllocation{{Name: "main", Devices: []api.DeviceGrant{{UUID: uuid, MemoryMiB: 40960, Cores: 0}}}}})
	if err != nil {
		panic(err)
	}
	return string(b)
}

func recordPatch(value *string) []byte {
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{api.AnnotationAllocation: value}}})
	return b
}

func expectRecordRefused(t *testing.T, err error, by string) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted, want a refusal by %s", by)
	}
	if !strings.Contains(err.Error(), "only") || !strings.Contains(err.Error(), webhook.DefaultSchedulerUser) || !strings.Contains(err.Error(), by) {
		t.Fatalf("refusal %q does not name the scheduler's identity and %s", err, by)
	}
}

// TestOnlyTheSchedulerWritesRecords plays the trust issue's attacks on the
// allocation record through a real API server, as a tenant with ordinary
// namespace rights (and pods/binding), against the shipped admission
// policy and the webhook. Before the fix every one of them was admitted.
func TestOnlyTheSchedulerWritesRecords(t *testing.T) {
	e := newEnv(t)
	nodes := e.addNodes("a100", 2, 8, "NVIDIA A100-SXM4-40GB", 40960)
	e.startScheduler()
	ctx := context.Background()
	const ns = "team-a"
	const tenantUser = "system:serviceaccount:team-a:tenant"
	tenant := e.tenant(ns)
	victim := fixtures.GPUUUID(nodes[0], 0)

	// Finding 1: watch your own pod and rewrite its record the moment it
	// is bound (the race that won 3 of 30 tries).
	t.Run("bound-pod patch race", func(t *testing.T) {
		w, err := tenant.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		const tries = 30
		for i := range tries {
			if _, err := tenant.CoreV1().Pods(ns).Create(ctx, fixtures.MakePod().Namespace(ns).Name(fmt.Sprintf("race-%02d", i)).Container("main", map[string]string{names.GPU: "0.1"}).Obj(), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		refused := 0
		bad := forged(nodes[0], victim)
		deadline := time.After(time.Minute)
		for refused < tries {
			select {
			case ev := <-w.ResultChan():
				p, ok := ev.Object.(*corev1.Pod)
				if !ok || ev.Type != watch.Modified || p.Spec.NodeName == "" || p.Annotations[api.AnnotationAllocation] == bad {
					continue
				}
				if p.Annotations["done"] != "" {
					continue
				}
				_, err := tenant.CoreV1().Pods(ns).Patch(ctx, p.Name, types.MergePatchType, recordPatch(&bad), metav1.PatchOptions{})
				expectRecordRefused(t, err, tenantUser)
				refused++
				_, _ = e.cp.Client.CoreV1().Pods(ns).Patch(ctx, p.Name, types.MergePatchType, []byte(`{"metadata":{"annotations":{"done":"1"}}}`), metav1.PatchOptions{})
			case <-deadline:
				t.Fatalf("only %d of %d pods bound and attacked in a minute", refused, tries)
			}
		}
		pods, _ := e.cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		for _, p := range pods.Items {
			if p.Annotations[api.AnnotationAllocation] == bad {
				t.Errorf("pod %s carries the forged record", p.Name)
			}
		}
		// Finding 2's first step: removing the record, also refused.
		_, err = tenant.CoreV1().Pods(ns).Patch(ctx, "race-00", types.MergePatchType, recordPatch(nil), metav1.PatchOptions{})
		expectRecordRefused(t, err, tenantUser)
	})

	// Finding 3: a pod that names its own scheduler and binds itself
	// with a forged record.
	t.Run("self-binding", func(t *testing.T) {
		p := fixtures.MakePod().Namespace(ns).Name("self").SchedulerName("my-own-scheduler").Container("main", map[string]string{names.GPU: "0.1"}).Obj()
		if _, err := tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "self", Annotations: map[string]string{api.AnnotationAllocation: forged(nodes[1], fixtures.GPUUUID(nodes[1], 0))}},
			Target: corev1.ObjectReference{Kind: "Node", Name: nodes[1]}}
		expectRecordRefused(t, tenant.CoreV1().Pods(ns).Bind(ctx, b, metav1.CreateOptions{}), tenantUser)
		got, _ := e.cp.Client.CoreV1().Pods(ns).Get(ctx, "self", metav1.GetOptions{})
		if got.Spec.NodeName != "" {
			t.Errorf("bound to %s", got.Spec.NodeName)
		}
	})

	// Finding 4: a CPU-only pod with nodeName and a forged record, in the
	// tenant's namespace and in kube-system (which the webhook's other
	// hooks never see).
	t.Run("CPU-only squatter", func(t *testing.T) {
		squat := func(namespace string) *corev1.Pod {
			return fixtures.MakePod().Namespace(namespace).Name("squatter").Node(nodes[1]).Container("c", map[string]string{"cpu": "100m"}).
				Annotation(api.AnnotationAllocation, forged(nodes[1], fixtures.GPUUUID(nodes[1], 1))).Obj()
		}
		_, err := tenant.CoreV1().Pods(ns).Create(ctx, squat(ns), metav1.CreateOptions{})
		expectRecordRefused(t, err, tenantUser)
		_, err = e.cp.Client.CoreV1().Pods("kube-system").Create(ctx, squat("kube-system"), metav1.CreateOptions{})
		expectRecordRefused(t, err, "system:apiserver") // the admin
		// Status updates carry metadata too.
		p, err := tenant.CoreV1().Pods(ns).Create(ctx, fixtures.MakePod().Namespace(ns).Name("status").Container("c", map[string]string{"cpu": "100m"}).Obj(), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Annotations = map[string]string{api.AnnotationAllocation: forged(nodes[1], fixtures.GPUUUID(nodes[1], 1))}
		_, err = tenant.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		expectRecordRefused(t, err, tenantUser)
	})

	// Each enforcement point holds alone: the policy without the webhook,
	// the webhook without the policy.
	t.Run("policy alone", func(t *testing.T) {
		if err := e.cp.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, "tessera-webhook", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		bad := forged(nodes[0], victim)
		testenv.WaitFor(t, "the webhook out of the way", 30*time.Second, func() bool {
			_, err := tenant.CoreV1().Pods(ns).Patch(ctx, "race-01", types.MergePatchType, recordPatch(&bad), metav1.PatchOptions{})
			return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy")
		})
		_, err := tenant.CoreV1().Pods(ns).Patch(ctx, "race-01", types.MergePatchType, recordPatch(&bad), metav1.PatchOptions{})
		expectRecordRefused(t, err, webhook.RecordPolicyName)
	})
	t.Run("webhook alone", func(t *testing.T) {
		e.stopWebhook()
		e.startWebhook() // registers its configurations again
		binding, err := e.cp.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, webhook.RecordPolicyName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.cp.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, webhook.RecordPolicyName, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			binding.ResourceVersion = ""
			if _, err := e.cp.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
				t.Error(err)
			}
		}()
		bad := forged(nodes[0], victim)
		testenv.WaitFor(t, "the policy out of the way", 30*time.Second, func() bool {
			_, err := tenant.CoreV1().Pods(ns).Patch(ctx, "race-02", types.MergePatchType, recordPatch(&bad), metav1.PatchOptions{})
			return err != nil && strings.Contains(err.Error(), "records.pods.tessera.io")
		})
		_, err = tenant.CoreV1().Pods(ns).Patch(ctx, "race-02", types.MergePatchType, recordPatch(&bad), metav1.PatchOptions{})
		expectRecordRefused(t, err, "records.pods.tessera.io")
	})
}

// TestHostileGPUPods: findings 5, 7 and 8 through the API server, as a
// tenant: settings that override what the node agent gives a container,
// settings under which isolation cannot hold, and input edge cases. Each
// is refused with the field, the value and why; before the fix each was
// admitted (the quantities wrapped, the annotation took 9 s).
func TestHostileGPUPods(t *testing.T) {
	e := newEnv(t)
	e.addNodes("a100", 1, 2, "NVIDIA A100-SXM4-40GB", 40960)
	ctx := context.Background()
	const ns = "team-b"
	tenant := e.tenant(ns)
	share := map[string]string{names.GPU: "0.1"}
	yes := true
	var huge strings.Builder
	for i := 0; huge.Len() < 240<<10; i++ {
		fmt.Fprintf(&huge, "model-%d,", i)
	}
	cases := []struct {
		name   string
		pod    *corev1.Pod
		want   []string
		mutate func(p *corev1.Pod)
	}{
		{"env all GPUs", nil, []string{"NVIDIA_VISIBLE_DEVICES"}, func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
		}},
		{"volume above the preload list", nil, []string{"volumeMounts[0].mountPath", `"/etc" is above /etc/ld.so.preload`}, func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "v", MountPath: "/etc"}}
		}},
		{"volume above the limiter", nil, []string{`"/usr/local" is above /usr/local/tessera`}, func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "v", MountPath: "/usr/local"}}
		}},
		{"envFrom without prefix", nil, []string{"envFrom[0]", "without a prefix"}, func(p *corev1.Pod) {
			p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "x"}}}}
		}},
		{"volume over the preload list", nil, []string{"volumeMounts[0].mountPath", "/etc/ld.so.preload"}, func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "v", MountPath: "/etc/ld.so.preload"}}
		}},
		{"volume over the limits file", nil, []string{"/etc/tessera"}, func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "v", MountPath: "/etc/tessera"}}
		}},
		{"hostPID", nil, []string{"spec.hostPID"}, func(p *corev1.Pod) { p.Spec.HostPID = true }},
		{"hostIPC", nil, []string{"spec.hostIPC"}, func(p *corev1.Pod) { p.Spec.HostIPC = true }},
		{"SYS_ADMIN", nil, []string{"capabilities.add[0]", "SYS_ADMIN"}, func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}}
		}},
		{"privileged", nil, []string{"securityContext.privileged"}, func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &yes}
		}},
		{"hostPath /dev", nil, []string{"spec.volumes[0].hostPath.path", `"/dev"`}, func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/dev"}}}}
		}},
		{"gpumem past 2^64", fixtures.MakePod().Namespace(ns).Name("q1").Container("main", map[string]string{names.Memory: "18446744073709552616"}).Obj(),
			[]string{"limits[nvidia.com/gpumem]", "18446744073709552616", "between 0 and 16777216"}, nil},
		{"gpu past 2^63", fixtures.MakePod().Namespace(ns).Name("q2").Container("main", map[string]string{names.GPU: "9223372036854775808"}).Obj(),
			[]string{"limits[nvidia.com/gpu]", "9223372036854775808", "between 0 and 64"}, nil},
		{"gpumem 0 alone", fixtures.MakePod().Namespace(ns).Name("q3").Container("main", map[string]string{names.Memory: "0"}).Obj(),
			[]string{"limits[nvidia.com/gpumem]", "a GPU share needs memory"}, nil},
		{"240 KB nouse-gputype", nil, []string{"metadata.annotations", "more than the limit of 16384"}, func(p *corev1.Pod) {
			p.Annotations = map[string]string{"nvidia.com/nouse-gputype": huge.String()}
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.pod
			if p == nil {
				p = fixtures.MakePod().Namespace(ns).Name(fmt.Sprintf("h%02d", i)).Container("main", share).Obj()
				tc.mutate(p)
			}
			start := time.Now()
			_, err := tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			expectDenied(t, err, tc.want...)
			if tc.name == "240 KB nouse-gputype" {
				t.Logf("refused in %v", time.Since(start).Round(time.Millisecond))
			}
		})
	}
	// The env overrides refused before (finding 5): each sets a variable
	// the limiter ignores when its read-only limits file exists (always,
	// in a GPU container the agent serves), or one the tenant could set
	// inside the container anyway. Admitted now, and the pod is given
	// exactly its share: 0.1 of an A100-40GB is 4096 MiB and 10 % of its
	// cores in the record the scheduler signs, which is what the agent
	// writes into the limits file whatever the environment says
	// (deviceplugin TestSpecEnvironmentChangesNoShare; the limiter:
	// limiter/test file-over-env). On the lab, the stand-in refused at the
	// limit: part of the lab's acceptance run.
	e.startScheduler() // one scheduler for this subtest and the next
	t.Run("env overrides admitted with exactly their share", func(t *testing.T) {
		for i, ev := range []corev1.EnvVar{
			{Name: "CUDA_DEVICE_MEMORY_LIMIT_0", Value: "0"}, {Name: "CUDA_DEVICE_SM_LIMIT", Value: "100"},
			{Name: "CUDA_DEVICE_MEMORY_LIMIT_", Value: "1m"}, {Name: "LD_PRELOAD", Value: "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"},
		} {
			p := fixtures.MakePod().Namespace(ns).Name(fmt.Sprintf("ok%02d", i)).Container("main", share).Obj()
			p.Spec.Containers[0].Env = []corev1.EnvVar{ev}
			if _, err := tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Fatalf("%s refused: %v", ev.Name, err)
			}
			rec := waitRecord(t, e, ns, p.Name)
			if len(rec.Containers) != 1 || len(rec.Containers[0].Devices) != 1 || rec.Containers[0].Devices[0].MemoryMiB != 4096 || rec.Containers[0].Devices[0].Cores != 10 {
				t.Errorf("%s: record %+v, want one GPU with 4096 MiB and 10 %% of its cores", ev.Name, rec.Containers)
			}
		}
	})
	// kube-system is outside the webhook's reach: there the scheduler
	// refuses the request, and its event carries no format verb.
	t.Run("kube-system gpucores 150", func(t *testing.T) {
		p := fixtures.MakePod().Namespace("kube-system").Name("cores150").SchedulerName(api.SchedulerName).Container("main", map[string]string{names.Cores: "150"}).Obj()
		if _, err := e.cp.Client.CoreV1().Pods("kube-system").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var note string
		testenv.WaitFor(t, "the FailedScheduling event", 30*time.Second, func() bool {
			evs, err := e.cp.Client.CoreV1().Events("kube-system").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=cores150"})
			if err != nil || len(evs.Items) == 0 {
				return false
			}
			note = evs.Items[0].Message
			return true
		})
		if strings.Contains(note, "%!") || !strings.Contains(note, "150") {
			t.Errorf("event %q", note)
		}
	})
	// A trusted namespace (labelled by an administrator) may run hostPID;
	// it may still not override the agent's environment.
	t.Run("trusted namespace", func(t *testing.T) {
		if _, err := e.cp.Client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(`{"metadata":{"labels":{"`+webhook.TrustedLabel+`":"true"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		p := fixtures.MakePod().Namespace(ns).Name("trusted").Container("main", share).Obj()
		p.Spec.HostPID = true
		testenv.WaitFor(t, "the webhook to see the label", 30*time.Second, func() bool {
			_, err := tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err == nil
		})
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
		_, err := tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		expectDenied(t, err, "NVIDIA_VISIBLE_DEVICES")
		// A tenant cannot label its own namespace.
		_, err = tenant.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("a tenant labelled its namespace: %v", err)
		}
	})
}
