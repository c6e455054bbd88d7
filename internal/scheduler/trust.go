package scheduler

// The proof of origin of allocation records: the scheduler signs every
// record it writes, and when it rebuilds its state from the records on
// pods it charges only those it can vouch for (docs/security.md).

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/gpushare"
	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/recordcheck"
	"github.com/tessera-gpu/tessera/internal/recordsig"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Reasons of the Warning events the scheduler puts on pods whose records
// it does not charge.
const (
	ReasonRecordIgnored = "TesseraRecordIgnored"
	ReasonRecordMissing = "TesseraRecordMissing"
	// ReasonRecordUnverified: charged, but not signed by a key the
	// scheduler holds.
	ReasonRecordUnverified = "TesseraRecordUnverified"
)

// trust signs the records the plugin writes and checks those it reads
// back. With no signer (signing disabled, or unit tests without an API
// server) records are written unsigned and read back checked against
// their pods' requests only.
type trust struct {
	names    api.ResourceNames
	signer   *recordsig.Signer
	keys     *recordsig.Keyring
	recorder events.EventRecorder

	mu     sync.Mutex
	warned map[types.UID]string // the last warning event per pod
}

// sign binds the record to its pod and signs it.
func (t *trust) sign(pod *corev1.Pod, rec *api.PodAllocation) error {
	rec.PodUID = string(pod.UID)
	if t == nil || t.signer == nil {
		return nil
	}
	return t.signer.Sign(rec)
}

// check decides whether a record read from a pod may be charged, and
// says why not. A record must be for this pod and grant exactly what the
// pod asks (recordcheck): charging anything else would let whoever wrote
// it reserve GPUs for a pod that asked for none (the CPU-only squatter)
// or more than it asked. A record with a signature that does not verify
// was changed after it was signed (a share moved to another GPU, say) and
// is not charged either. note is set (and the record still charged) for a
// record this scheduler cannot vouch for although it matches the request:
// signed by a key it does not hold (its Secret lost or the key rotated out
// too early), so that no running pod's share is forgotten; an unsigned
// record is what the previous release wrote and is charged silently.
func (t *trust) check(pod *corev1.Pod, rec *api.PodAllocation, gpus recordcheck.Lookup) (note string, err error) {
	if t == nil {
		return "", nil
	}
	if t.keys != nil {
		switch err := t.keys.Verify(rec); {
		case err == nil, errors.Is(err, recordsig.ErrUnsigned):
		case errors.Is(err, recordsig.ErrUnknownKey):
			note = fmt.Sprintf("GPU allocation record %v; charged because it matches the pod's request", err)
		default:
			return "", err
		}
	}
	if err := recordcheck.MatchPod(pod, rec, t.names, gpus); err != nil {
		return "", fmt.Errorf("the record does not match the pod's request: %w", err)
	}
	return note, nil
}

// gpusOf is what the scheduler's inventories say of a node's GPUs, for
// recordcheck: their memory, and their replicas where the node shares
// them by replicas.
func (s *state) gpusOf(node string) recordcheck.Lookup {
	return func(uuid string) (recordcheck.GPU, bool) {
		s.mu.RLock()
		defer s.mu.RUnlock()
		n := s.cluster.Node(node)
		if n == nil {
			return recordcheck.GPU{}, false
		}
		i := n.GPUByUUID(uuid)
		if i < 0 {
			return recordcheck.GPU{}, false
		}
		g := &n.GPUs[i]
		out := recordcheck.GPU{MemoryMiB: g.MemoryMiB}
		if gpushare.Replicated(g.Sharing) {
			out.Replicas = g.MaxShares
		}
		return out, true
	}
}

// warn emits a Warning event on the pod once per pod and message.
func (t *trust) warn(logger klog.Logger, pod *corev1.Pod, reason, msg string) {
	logger.Error(nil, "A GPU allocation record the scheduler cannot vouch for", "pod", klog.KObj(pod), "reason", reason, "detail", msg)
	recordsIgnored.WithLabelValues(reason).Inc()
	if t == nil || t.recorder == nil {
		return
	}
	t.mu.Lock()
	if t.warned == nil {
		t.warned = map[types.UID]string{}
	}
	if t.warned[pod.UID] == msg {
		t.mu.Unlock()
		return
	}
	t.warned[pod.UID] = msg
	t.mu.Unlock()
	t.recorder.Eventf(pod, nil, corev1.EventTypeWarning, reason, "RebuildState", "%s", msg)
}

// forget drops the pod's warning state once it is gone.
func (t *trust) forget(uid types.UID) {
	if t == nil {
		return
	}
	t.mu.Lock()
	delete(t.warned, uid)
	t.mu.Unlock()
}

// asksGPU reports whether the pod asks this scheduler's resources for at
// least one GPU (a count of 0 alone asks for none).
func asksGPU(pod *corev1.Pod, names api.ResourceNames) bool {
	if !kubeobj.RequestsGPU(pod, names) {
		return false
	}
	asks, err := recordcheck.Asks(pod, names)
	return err != nil || len(asks) > 0
}

// statusText makes a message safe for kube-scheduler, which uses a
// failed pod's status message as the format string of its
// FailedScheduling event: a '%' in it (the core's "150%", or a model
// name from a pod's annotation) would come out as "%!o(MISSING)". The
// same text goes into the pod's condition verbatim, so '%' is spelled out
// rather than doubled.
func statusText(s string) string { return strings.ReplaceAll(s, "%", " percent") }
