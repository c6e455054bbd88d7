package webhook

// What the webhook tells besides its answers: every isolation finding is
// counted (tessera_webhook_isolation_findings_total{check, action}), and
// in audit mode each admitted pod with findings gets a Warning event
// (TesseraIsolationFinding) on its controller (a ReplicaSet, a Job, the
// workload whose template it is) or, without one, on the pod, so a
// platform team sees what enforcing would refuse before it enforces.

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/record"
)

// ReasonIsolationFinding is the reason of the audit mode's events.
const ReasonIsolationFinding = "TesseraIsolationFinding"

// Findings reports isolation findings: a metric and, for admitted pods in
// audit mode, an event. Its Report is Admission.Report.
type Findings struct {
	count    *prometheus.CounterVec
	recorder record.EventRecorder
}

// NewFindings registers the findings metric with reg and sends events
// through recorder (nil: none).
func NewFindings(reg prometheus.Registerer, recorder record.EventRecorder) (*Findings, error) {
	f := &Findings{
		count: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tessera_webhook_isolation_findings_total",
			Help: "Isolation findings in pods and pod templates the webhook reviewed (settings under which a GPU share cannot be held, docs/security.md), by check and by what the webhook did: refused, or warned (audit mode).",
		}, []string{"check", "action"}),
		recorder: recorder,
	}
	if err := reg.Register(f.count); err != nil {
		return nil, err
	}
	return f, nil
}

// Report counts findings and, when the pod was admitted with them (audit
// mode), records an event on the pod's controller or the pod.
func (f *Findings) Report(pod *corev1.Pod, findings field.ErrorList, audited bool) {
	action := "refused"
	if audited {
		action = "warned"
	}
	for _, e := range findings {
		f.count.WithLabelValues(FindingCheck(e), action).Inc()
	}
	if !audited || f.recorder == nil {
		return
	}
	ref := eventTarget(pod)
	if ref == nil {
		return
	}
	msgs := make([]string, len(findings))
	for i, e := range findings {
		msgs[i] = e.Error()
	}
	f.recorder.Event(ref, corev1.EventTypeWarning, ReasonIsolationFinding,
		truncate(fmt.Sprintf("audit mode admitted a pod the webhook would refuse: %s", strings.Join(msgs, "; ")), 1024))
}

// eventTarget is the object an audit event is about: the pod's
// controller, else the pod when it has a name (pods created with
// generateName have none at admission), else nothing.
func eventTarget(pod *corev1.Pod) *corev1.ObjectReference {
	for _, o := range pod.OwnerReferences {
		if o.Controller != nil && *o.Controller {
			return &corev1.ObjectReference{APIVersion: o.APIVersion, Kind: o.Kind, Name: o.Name, Namespace: pod.Namespace, UID: o.UID}
		}
	}
	if pod.Name == "" {
		return nil
	}
	return &corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-len("…")] + "…"
}

// checkNames are the field names that name a finding's check, most
// specific first.
var checkNames = []string{"hostPID", "hostIPC", "privileged", "capabilities", "procMount", "hostPath", "envFrom", "env", "volumeMounts", "volumeDevices", "annotations"}

var indexRe = regexp.MustCompile(`\[[^]]*\]`)

// FindingCheck names the check of a finding by its field
// ("spec.containers[0].env[1].name" → "env").
func FindingCheck(e *field.Error) string {
	parts := strings.Split(indexRe.ReplaceAllString(e.Field, ""), ".")
	for _, c := range checkNames {
		for _, p := range parts {
			if p == c {
				return c
			}
		}
	}
	return "other"
}
