package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/internal/testenv/fixtures"
	"github.com/tessera-gpu/tessera/pkg/api"
)

func testAdmission() *Admission {
	return &Admission{Names: api.DefaultResourceNames, SchedulerName: api.SchedulerName, LargestGPUMiB: func() int64 { return 40960 }}
}

// pod is a pod whose container "main" asks res, with requests equal to
// limits as the API server defaults them before admission.
func pod(res map[string]string) *corev1.Pod {
	p := fixtures.MakePod().Namespace("default").Name("p").SchedulerName(corev1.DefaultSchedulerName).Container("main", res).Obj()
	c := &p.Spec.Containers[0]
	for k, v := range c.Resources.Limits {
		if c.Resources.Requests == nil {
			c.Resources.Requests = corev1.ResourceList{}
		}
		c.Resources.Requests[k] = v
	}
	return p
}

func TestValidateRejections(t *testing.T) {
	yes := true
	tests := []struct {
		name   string
		mutate func(p *corev1.Pod)
		res    map[string]string
		want   []string
	}{
		{"cores above 100", nil, map[string]string{"nvidia.com/gpucores": "101"}, []string{"spec.containers[0].resources.limits[nvidia.com/gpucores]", "101", "between 0 and 100"}},
		{"cores below 0", nil, map[string]string{"nvidia.com/gpucores": "-1"}, []string{"nvidia.com/gpucores", "-1", "must not be negative"}},
		{"percentage above 100", nil, map[string]string{"nvidia.com/gpumem-percentage": "150"}, []string{"limits[nvidia.com/gpumem-percentage]", "150", "between 0 and 100"}},
		{"memory both ways", nil, map[string]string{"nvidia.com/gpumem": "1000", "nvidia.com/gpumem-percentage": "10"}, []string{"nvidia.com/gpumem-percentage", "nvidia.com/gpumem=1000"}},
		{"memory above largest GPU", nil, map[string]string{"nvidia.com/gpumem": "50000"}, []string{"limits[nvidia.com/gpumem]", "50000", "40960 MiB"}},
		{"requests unequal limits", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Requests["nvidia.com/gpumem"] = resource.MustParse("500")
		}, map[string]string{"nvidia.com/gpumem": "1000"}, []string{"requests[nvidia.com/gpumem]", "500", "limit 1000"}},
		{"model included and excluded", func(p *corev1.Pod) {
			p.Annotations = map[string]string{"nvidia.com/use-gputype": "A100", "tessera.io/nouse-gputype": "A100"}
		}, map[string]string{"nvidia.com/gpu": "1"}, []string{"metadata.annotations", "A100", "both selected", "excluded"}},
		{"privileged", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &yes}
		}, map[string]string{"nvidia.com/gpumem": "1000"}, []string{"spec.containers[0].securityContext.privileged", "privileged"}},
		{"node name preset", func(p *corev1.Pod) { p.Spec.NodeName = "n1" }, map[string]string{"nvidia.com/gpu": "1"}, []string{"spec.nodeName", "n1", api.SchedulerName}},
		{"fraction above 1", nil, map[string]string{"nvidia.com/gpu": "1.5"}, []string{"nvidia.com/gpu", "1500m", "below 1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := pod(tc.res)
			if tc.mutate != nil {
				tc.mutate(p)
			}
			errs := testAdmission().Validate(p)
			if len(errs) == 0 {
				t.Fatal("accepted")
			}
			msg := Message(errs)
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("%q does not mention %q", msg, w)
				}
			}
		})
	}
}

func TestMutate(t *testing.T) {
	adm := testAdmission()
	tests := []struct {
		name string
		res  map[string]string
		want map[string]int64
	}{
		{"fraction", map[string]string{"nvidia.com/gpu": "0.5"}, map[string]int64{"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50, "nvidia.com/gpucores": 50}},
		{"memory only", map[string]string{"nvidia.com/gpumem": "1000"}, map[string]int64{"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}},
		{"count only", map[string]string{"nvidia.com/gpu": "2", "nvidia.com/gpucores": "30"}, map[string]int64{"nvidia.com/gpu": 2, "nvidia.com/gpumem-percentage": 100, "nvidia.com/gpucores": 30}},
		{"MIG device", map[string]string{"nvidia.com/mig-1g.5gb": "1"}, map[string]int64{"nvidia.com/mig-1g.5gb": 1}},
		{"shared rename", map[string]string{"nvidia.com/gpu.shared": "1"}, map[string]int64{"nvidia.com/gpu.shared": 1, "nvidia.com/gpumem-percentage": 100}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := pod(tc.res)
			if errs := adm.Validate(in); len(errs) > 0 {
				t.Fatal(Message(errs))
			}
			out, changed, err := adm.Mutate(in)
			if err != nil || !changed {
				t.Fatalf("changed=%v err=%v", changed, err)
			}
			if out.Spec.SchedulerName != api.SchedulerName {
				t.Errorf("schedulerName %q", out.Spec.SchedulerName)
			}
			r := out.Spec.Containers[0].Resources
			for _, list := range []corev1.ResourceList{r.Limits, r.Requests} {
				got := map[string]int64{}
				for k, v := range list {
					got[string(k)] = v.Value()
				}
				delete(got, QuotaMemoryResource) // quota_test.go checks it
				if len(got) != len(tc.want) {
					t.Errorf("got %v, want %v", got, tc.want)
				}
				for k, v := range tc.want {
					if got[k] != v {
						t.Errorf("%s = %d, want %d", k, got[k], v)
					}
				}
			}
			if errs := adm.Validate(out); len(errs) > 0 {
				t.Errorf("mutated pod invalid: %s", Message(errs))
			}
		})
	}
	cpu := fixtures.MakePod().Namespace("default").Name("cpu").SchedulerName(corev1.DefaultSchedulerName).Container("c", map[string]string{"cpu": "1"}).Obj()
	if _, changed, _ := adm.Mutate(cpu); changed {
		t.Error("pod without GPU resources mutated")
	}
	other := pod(map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100"})
	other.Spec.SchedulerName = "my-scheduler"
	if out, _, _ := adm.Mutate(other); out.Spec.SchedulerName != "my-scheduler" {
		t.Error("explicit scheduler name overwritten")
	}
}

func review(t *testing.T, client *http.Client, url string, p *corev1.Pod) *admissionv1.AdmissionResponse {
	t.Helper()
	raw, _ := json.Marshal(p)
	body, _ := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       "u1",
			Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Operation: admissionv1.Create,
			Namespace: "default",
			Object:    runtime.RawExtension{Raw: raw},
		},
	})
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if out.Response == nil || out.Response.UID != "u1" {
		t.Fatalf("bad response %+v", out)
	}
	return out.Response
}

func TestHandlerOverTLS(t *testing.T) {
	ca, err := NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.ServingCert([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(testAdmission().Handler(klog.Background()))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	defer srv.Close()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}

	in := pod(map[string]string{"nvidia.com/gpu": "0.5"})
	resp := review(t, client, srv.URL+MutatePath, in)
	if !resp.Allowed || resp.PatchType == nil {
		t.Fatalf("mutate: %+v", resp)
	}
	patch, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(in)
	patched, err := patch.Apply(raw)
	if err != nil {
		t.Fatal(err)
	}
	var out corev1.Pod
	if err := json.Unmarshal(patched, &out); err != nil {
		t.Fatal(err)
	}
	if q := out.Spec.Containers[0].Resources.Limits["nvidia.com/gpucores"]; q.Value() != 50 || out.Spec.SchedulerName != api.SchedulerName {
		t.Errorf("patched pod: %+v", out.Spec)
	}
	if resp := review(t, client, srv.URL+ValidatePath, pod(map[string]string{"nvidia.com/gpucores": "200"})); resp.Allowed || !strings.Contains(resp.Result.Message, "200") {
		t.Errorf("validate: %+v", resp.Result)
	}
}

func TestRegistrationAndCA(t *testing.T) {
	ctx := context.Background()
	client := fake.NewSimpleClientset()
	ca1, err := LoadOrCreateCA(ctx, client, "tessera-system", "ca")
	if err != nil {
		t.Fatal(err)
	}
	ca2, err := LoadOrCreateCA(ctx, client, "tessera-system", "ca")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ca1.CertPEM, ca2.CertPEM) {
		t.Error("second replica got a different CA")
	}
	reg := Registration{Name: "tessera-webhook", ServiceNamespace: "tessera-system", ServiceName: "tessera-webhook", ServicePort: 443, CABundle: ca1.CertPEM, Names: api.DefaultResourceNames}
	for range 2 { // create, then update
		if err := reg.Apply(ctx, client); err != nil {
			t.Fatal(err)
		}
	}
	m, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "tessera-webhook", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w := m.Webhooks[0]
	if !bytes.Equal(w.ClientConfig.CABundle, ca1.CertPEM) || *w.FailurePolicy != "Fail" || len(w.MatchConditions) != 1 {
		t.Errorf("webhook %+v", w)
	}
	if !strings.Contains(w.MatchConditions[0].Expression, "'nvidia.com/gpumem-percentage'") {
		t.Errorf("match condition %q", w.MatchConditions[0].Expression)
	}
	if v := w.NamespaceSelector.MatchExpressions[0].Values; v[0] != "kube-system" {
		t.Errorf("namespace selector %v", v)
	}
}

func TestInventories(t *testing.T) {
	iv := NewInventories(ktesting.NewLogger(t, ktesting.NewConfig()))
	iv.Set(fixtures.Node("a", fixtures.Inventory("a", 2, "A100", 40960, 10), api.DefaultResourceNames))
	iv.Set(fixtures.Node("b", fixtures.Inventory("b", 2, "H100", 81920, 10), api.DefaultResourceNames))
	if got := iv.Largest(); got != 81920 {
		t.Fatalf("largest %d", got)
	}
	iv.Delete("b")
	if got := iv.Largest(); got != 40960 {
		t.Fatalf("largest after delete %d", got)
	}
	// An inventory that does not decode offers no GPUs.
	broken := fixtures.Node("a", fixtures.Inventory("a", 2, "A100", 40960, 10), api.DefaultResourceNames)
	broken.Annotations[api.AnnotationInventory] = `{"apiVersion":"tessera.io/v0"}`
	iv.Set(broken)
	if got := iv.Largest(); got != 0 {
		t.Fatalf("largest with an unreadable inventory %d, want 0", got)
	}
}

// TestMatchConditionEvaluates runs the CEL match condition, as the API
// server would, over pods asking for each kind of GPU resource.
func TestMatchConditionEvaluates(t *testing.T) {
	prg := celProgram(t, MatchCondition(api.DefaultResourceNames))
	for res, want := range map[string]bool{
		"nvidia.com/gpu": true, "nvidia.com/gpu.shared": true, "nvidia.com/mig-1g.5gb": true,
		"nvidia.com/gpucores": true, "cpu": false, "example.com/mig-1g.5gb": false,
		"volcano.sh/vgpu-memory": true, "volcano.sh/vgpu-number": true,
	} {
		if got := evalPod(t, prg, pod(map[string]string{res: "1"})); got != want {
			t.Errorf("pod asking %s: match %v, want %v", res, got, want)
		}
	}
}
