//go:build integration

package lab_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tessera-gpu/tessera/internal/install"
	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/lab"
	"github.com/tessera-gpu/tessera/internal/lab/status"
	"github.com/tessera-gpu/tessera/internal/lab/supervisor"
	"github.com/tessera-gpu/tessera/internal/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/internal/scheduler"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/internal/webhook"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// The trust issue's attacks that reach a node: the admission policy and
// the webhook refuse them, and where they are taken out of the way (a
// cluster without the policy, an attacker with a node's credentials) the
// node agent and the scheduler still keep every GPU within its physical
// memory. Each test leaves the lab as it found it.

const victimNode = "lab-gpu-04"

// tenantClient is a user with ordinary namespace rights in ns plus
// pods/binding (the trust issue's attacker).
func tenantClient(t *testing.T, ns string) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	useNamespace(t, ns)
	if _, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "configmaps"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"pods/binding", "pods/status"}, Verbs: []string{"create", "update", "patch"}},
	}}
	if _, err := client.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}, RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "tenant"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "tenant", Namespace: ns}}}
	if _, err := client.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tr, err := client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "tenant", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := clientcmd.BuildConfigFromFlags("", dir.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(admin)
	cfg.BearerToken = tr.Status.Token
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the tenant's rights", 30*time.Second, func() bool {
		_, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil
	})
	return c
}

func forgedRecord(node, uuid string) string {
	b, err := api.EncodeAllocation(&api.PodAllocation{Node: node, Containers: []api.ContainerAllocation{{Name: "c", Devices: []api.DeviceGrant{{UUID: uuid, MemoryMiB: 40960}}}}})
	if err != nil {
		panic(err)
	}
	return string(b)
}

func nodeGPUs(t *testing.T, node string) []api.GPU {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := kubeobj.Inventory(n)
	if err != nil || inv == nil {
		t.Fatalf("node %s inventory: %v", node, err)
	}
	return inv.GPUs
}

// waitFailed waits until the pod has failed and returns its status
// message.
func waitFailed(t *testing.T, ns, name string) string {
	t.Helper()
	var msg string
	testenv.WaitFor(t, ns+"/"+name+" rejected", 2*time.Minute, func() bool {
		p, err := client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodFailed {
			return false
		}
		msg = p.Status.Reason + ": " + p.Status.Message
		return true
	})
	return msg
}

// eventsOf are the reasons and messages of the events on a pod.
func eventsOf(t *testing.T, ns, name string) []string {
	t.Helper()
	evs, err := client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		out = append(out, e.Reason+": "+e.Message)
	}
	evs2, err := client.EventsV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err == nil {
		for _, e := range evs2.Items {
			if e.Regarding.Name == name {
				out = append(out, e.Reason+": "+e.Note)
			}
		}
	}
	return out
}

// TestSelfBindingGetsNoGPU: finding 3. A pod that names its own scheduler
// may not bind itself with a record; bound without one, its node refuses
// it every GPU.
func TestSelfBindingGetsNoGPU(t *testing.T) {
	ctx := context.Background()
	const ns = "self-binding"
	tenant := tenantClient(t, ns)
	p := fixtures.MakePod().Namespace(ns).Name("self").SchedulerName("my-own-scheduler").ZeroTerminationGracePeriod().
		Container("c", map[string]string{names.GPU: "0.1"}).Obj()
	if _, err := tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gpu := nodeGPUs(t, victimNode)[0].UUID
	b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "self", Annotations: map[string]string{api.AnnotationAllocation: forgedRecord(victimNode, gpu)}},
		Target: corev1.ObjectReference{Kind: "Node", Name: victimNode}}
	if err := tenant.CoreV1().Pods(ns).Bind(ctx, b, metav1.CreateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), webhook.DefaultSchedulerUser) {
		t.Fatalf("binding with a forged record: %v", err)
	}
	b.Annotations = nil
	if err := tenant.CoreV1().Pods(ns).Bind(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatalf("binding without a record: %v", err)
	}
	if msg := waitFailed(t, ns, "self"); !strings.Contains(msg, "has no "+api.AnnotationAllocation+" annotation") {
		t.Errorf("the self-bound pod failed with %q", msg)
	}
	checkInvariant(t)
}

// withoutPolicyBinding unbinds one of the shipped admission policies
// until the test ends, and waits until the API server lets probe pass.
func withoutPolicyBinding(t *testing.T, name string, probe func() error) {
	t.Helper()
	ctx := context.Background()
	bindings := client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	b, err := bindings.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := bindings.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.ResourceVersion, b.UID = "", ""
		if _, err := bindings.Create(ctx, b, metav1.CreateOptions{}); err != nil {
			t.Errorf("restoring policy binding %s: %v", name, err)
		}
	})
	testenv.WaitFor(t, "policy "+name+" out of the way", time.Minute, func() bool { return probe() == nil })
}

// TestForgedInventoryHeldToNVML: finding 6. An inventory claiming 409600
// MiB per GPU is refused by the admission policy; written anyway (by an
// attacker with the node's credentials: the policy unbound, the agent
// unable to repair its annotation), the scheduler believes it and binds
// pods past the GPUs' memory, and the node agent serves only what NVML's
// 40960 MiB hold, refusing the rest with an event. What the containers
// were given never exceeds a GPU.
func TestForgedInventoryHeldToNVML(t *testing.T) {
	ctx := context.Background()
	const ns = "forged-inventory"
	useNamespace(t, ns)
	node, err := client.CoreV1().Nodes().Get(ctx, victimNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := kubeobj.Inventory(node)
	if err != nil {
		t.Fatal(err)
	}
	for i := range inv.GPUs {
		inv.GPUs[i].MemoryMiB = 409600
	}
	fake, err := api.EncodeInventory(inv)
	if err != nil {
		t.Fatal(err)
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{api.AnnotationInventory: string(fake)}}})
	forge := func() error {
		_, err := client.CoreV1().Nodes().Patch(ctx, victimNode, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	}
	if err := forge(); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), webhook.DefaultNodeAgentUser) {
		t.Fatalf("forging the inventory with the policy in force: %v", err)
	}

	// The agent may not patch its Node for the length of the attack, so
	// the forged value stays (it rewrites its inventory otherwise).
	roles := client.RbacV1().ClusterRoles()
	role, err := roles.Get(ctx, "tessera-node-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	restricted := role.DeepCopy()
	for i, r := range restricted.Rules {
		if slices.Contains(r.Resources, "nodes") {
			restricted.Rules[i].Verbs = []string{"get", "list", "watch"}
		}
	}
	if _, err := roles.Update(ctx, restricted, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cur, err := roles.Get(ctx, "tessera-node-agent", metav1.GetOptions{})
		if err == nil {
			cur.Rules = role.Rules
			_, err = roles.Update(ctx, cur, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Errorf("restoring the node agent's role: %v", err)
		}
		testenv.WaitFor(t, "the agent to repair its inventory", 2*time.Minute, func() bool {
			gpus := nodeGPUs(t, victimNode)
			return gpus[0].MemoryMiB == 40960
		})
	})
	// Once the API server's authorizer denies the agent every write to
	// Nodes, nothing repairs the annotation: the forged value stays.
	testenv.WaitFor(t, "the node agent unable to write Nodes", 30*time.Second, func() bool {
		for _, verb := range []string{"patch", "update"} {
			r, err := client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:               webhook.DefaultNodeAgentUser,
				Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + install.Namespace, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Resource: "nodes", Name: victimNode},
			}}, metav1.CreateOptions{})
			if err != nil || r.Status.Allowed {
				return false
			}
		}
		return true
	})
	withoutPolicyBinding(t, webhook.InventoryPolicyName, forge)
	if got := nodeGPUs(t, victimNode)[0].MemoryMiB; got != 409600 {
		t.Fatalf("the forged inventory did not stay: GPU 0 has %d MiB", got)
	}

	var pods []*corev1.Pod
	for i := range 16 {
		p := fixtures.MakePod().Namespace(ns).Name(fmt.Sprintf("big-%02d", i)).ZeroTerminationGracePeriod().
			Container("c", map[string]string{names.Memory: "30000"}).Obj()
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": victimNode}
		pods = append(pods, p)
	}
	createAll(t, pods)
	if err := status.WaitSettled(ctx, client, ns, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	running, refused := 0, 0
	perGPU := map[string]int{}
	for _, p := range list.Items {
		switch p.Status.Phase {
		case corev1.PodRunning:
			running++
			rec := record(t, &p)
			perGPU[rec.Containers[0].Devices[0].UUID]++
		case corev1.PodFailed:
			if !strings.Contains(p.Status.Message, "would be over its memory") {
				t.Errorf("pod %s failed with %q", p.Name, p.Status.Message)
			}
			refused++
		}
	}
	for u, n := range perGPU {
		if n > 1 {
			t.Errorf("GPU %s runs %d pods of 30000 MiB", u, n)
		}
	}
	if refused == 0 {
		t.Fatalf("the scheduler was not deceived (%d running): the test proves nothing", running)
	}
	evs := eventsOf(t, ns, list.Items[0].Name)
	t.Logf("forged inventory: %d of 16 pods of 30000 MiB bound to %s; %d run (one per GPU), %d refused by the node agent; events of %s: %v",
		running+refused, victimNode, running, refused, list.Items[0].Name, evs)
	ph := checkPhysical(t)
	if err := ph.Err(); err != nil {
		t.Fatalf("physical invariant: %v", err)
	}
}

// TestRemovedRecordAndRestartedScheduler: finding 2. Removing a running
// pod's record is refused; done anyway (the policy unbound and the
// webhook's record hook removed), a restarted scheduler no longer counts
// the pod and places another over it, and the node agent refuses that
// one from its own ledger. The scheduler says which pod it cannot
// account for.
func TestRemovedRecordAndRestartedScheduler(t *testing.T) {
	ctx := context.Background()
	const ns = "removed-record"
	tenant := tenantClient(t, ns)
	gpu := nodeGPUs(t, victimNode)[1].UUID
	big := func(name string) *corev1.Pod {
		p := fixtures.MakePod().Namespace(ns).Name(name).ZeroTerminationGracePeriod().Annotation(api.AnnotationUseGPUUUID, gpu).
			Container("c", map[string]string{names.Memory: "30000"}).Obj()
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": victimNode}
		return p
	}
	if _, err := tenant.CoreV1().Pods(ns).Create(ctx, big("a"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := status.WaitSettled(ctx, client, ns, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	remove := []byte(`{"metadata":{"annotations":{"` + api.AnnotationAllocation + `":null}}}`)
	strip := func() error {
		_, err := tenant.CoreV1().Pods(ns).Patch(ctx, "a", types.MergePatchType, remove, metav1.PatchOptions{})
		return err
	}
	if err := strip(); !apierrors.IsForbidden(err) {
		t.Fatalf("removing the record with the policy in force: %v", err)
	}

	// Take both admission checks out of the way.
	hooks := client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	cfg, err := hooks.Get(ctx, "tessera-webhook", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	saved := cfg.DeepCopy()
	cfg.Webhooks = slices.DeleteFunc(cfg.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool { return w.Name == "records.pods.tessera.io" })
	if _, err := hooks.Update(ctx, cfg, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cur, err := hooks.Get(ctx, "tessera-webhook", metav1.GetOptions{})
		if err == nil {
			cur.Webhooks = saved.Webhooks
			_, err = hooks.Update(ctx, cur, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Errorf("restoring the webhook configuration: %v", err)
		}
	})
	withoutPolicyBinding(t, webhook.RecordPolicyName, strip)

	// The scheduler restarts and forgets pod a.
	st, err := lab.ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	old := st.Components["scheduler"]
	if err := syscall.Kill(old.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the scheduler restarted", time.Minute, func() bool {
		now, err := lab.ReadState(dir)
		return err == nil && now.Components["scheduler"].PID != old.PID && supervisor.ProcessAlive(now.Components["scheduler"].PID)
	})
	if _, err := tenant.CoreV1().Pods(ns).Create(ctx, big("b"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	msg := waitFailed(t, ns, "b")
	if !strings.Contains(msg, "would be over its memory") || !strings.Contains(msg, gpu) {
		t.Errorf("pod b: %q", msg)
	}
	var events []string
	testenv.WaitFor(t, "the agent's and the scheduler's events", time.Minute, func() bool {
		events = append(eventsOf(t, ns, "a"), eventsOf(t, ns, "b")...)
		return slices.ContainsFunc(events, func(e string) bool { return strings.HasPrefix(e, scheduler.ReasonRecordMissing) }) &&
			slices.ContainsFunc(events, func(e string) bool { return strings.HasPrefix(e, deviceplugin.ReasonRefused) })
	})
	// Physically: pod a still runs with its 30000 MiB, without a record;
	// no GPU was given past its memory.
	ph := checkPhysical(t)
	for _, err := range ph.Errors {
		if !strings.Contains(err.Error(), "/a container c runs with GPUs but its pod has no valid record") {
			t.Errorf("physical invariant: %v", err)
		}
	}
	if g := ph.GPUs[gpu]; g == nil || g.GivenMiB != 30000 {
		t.Errorf("GPU %s given %+v", gpu, g)
	}
}
