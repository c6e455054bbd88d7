package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/nodeagent/statedir"
	"github.com/tessera-gpu/tessera/internal/recordcheck"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// KubeletPod is a pod as the kubelet's pod-resources API lists it: the
// pods the kubelet has admitted or is admitting right now, with the device
// IDs of our resource it has assigned to each container so far.
type KubeletPod struct {
	Namespace, Name string
	// Devices maps container name to the device IDs assigned. The API
	// lists app containers and restartable init containers only.
	Devices map[string][]string
}

// KubeletPods lists the kubelet's active pods.
type KubeletPods interface {
	List(ctx context.Context) ([]KubeletPod, error)
}

// PodGetter returns a pod from the API (an informer cache backed by a
// direct read).
type PodGetter interface {
	GetPod(ctx context.Context, namespace, name string) (*v1.Pod, error)
}

// Matcher finds the pod and container a kubelet request is for. Neither
// GetPreferredAllocation nor Allocate names the pod, but the kubelet admits
// one pod at a time and allocates its containers in order (init containers
// first) during admission, after adding the pod to its pod manager, so
// while it waits on us exactly one active pod has a GPU container that is
// not yet served. The kubelet's pod-resources API tells us its active pods
// and what each container holds; the state directories (statedir) tell
// us which containers we
// have answered. No lock across pods, no guessing: if the answer is not
// exactly one pod, the request is refused (fail closed).
type Matcher struct {
	Node     string
	Resource string
	Kubelet  KubeletPods
	Pods     PodGetter
	State    statedir.Dirs
	// Protocol, if set, reads the pod's grants (another scheduler's
	// protocol); nil: Tessera's allocation record.
	Protocol Protocol
}

// Protocol is how a scheduler other than Tessera's tells the node what it
// granted a pod (Volcano's vGPU annotations: the node agent's volcano
// part). The matcher reads the grants through it and the guard holds them
// to the pod's request with it, in place of Tessera's signed record; the
// physical and ledger checks, the answer and the limiter are the same.
type Protocol interface {
	// Record returns the pod's grants as an allocation record; its Node
	// is the node the grants name. The error says what is missing.
	Record(pod *v1.Pod) (*api.PodAllocation, error)
	// Check holds the grants to the pod's own request; gpu is what NVML
	// says of the node's GPUs.
	Check(pod *v1.Pod, rec *api.PodAllocation, gpu recordcheck.Lookup) error
	// Served is told of each container answered, Refused of each refusal
	// of a pod's grants (the protocol's status on the pod).
	Served(ctx context.Context, t *Target)
	Refused(ctx context.Context, pod *v1.Pod, reason string)
}

// Target is the container a request belongs to, its grant and the
// pod's whole record.
type Target struct {
	Pod       *v1.Pod
	Container string
	Grant     api.ContainerAllocation
	Record    *api.PodAllocation
}

// pending is a pod with a GPU container not yet served.
type pending struct {
	pod       *v1.Pod
	container string
	init      bool
	count     int64
}

// ErrNoMatch wraps every refusal, so callers and tests can tell refusals
// from transport failures.
var ErrNoMatch = errors.New("refused")

// Match returns the target of a request for n devices.
func (m *Matcher) Match(ctx context.Context, n int) (*Target, error) {
	kps, err := m.Kubelet.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the kubelet's pods (pod-resources API): %w", err)
	}
	var cands []pending
	seen := map[types.UID]bool{}
	for _, kp := range kps {
		pod, err := m.Pods.GetPod(ctx, kp.Namespace, kp.Name)
		if apierrors.IsNotFound(err) {
			continue // deleted since the kubelet listed it
		}
		if err != nil {
			return nil, fmt.Errorf("reading pod %s/%s: %w", kp.Namespace, kp.Name, err)
		}
		// The pod-resources API names pods, not UIDs: a pod re-created under
		// its old name (a StatefulSet's) is listed twice while the old one
		// terminates, and both entries lead to the new pod. The old entry
		// shows the old pod's devices, so only the new one can be pending.
		if seen[pod.UID] || pod.Spec.NodeName != m.Node || pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
			continue
		}
		if c, init, cnt, ok := m.nextContainer(pod, kp); ok {
			seen[pod.UID] = true
			cands = append(cands, pending{pod, c, init, cnt})
		}
	}
	if len(cands) == 0 {
		return nil, fmt.Errorf("%w: no pod on node %s is waiting for %s (the kubelet lists %d active pods, all served)", ErrNoMatch, m.Node, m.Resource, len(kps))
	}
	var fit []pending
	for _, c := range cands {
		if c.count == int64(n) {
			fit = append(fit, c)
		}
	}
	if len(cands) == 1 && len(fit) == 0 {
		c := cands[0]
		return nil, fmt.Errorf("%w: pod %s/%s container %s asks for %d %s, the kubelet's request is for %d", ErrNoMatch, c.pod.Namespace, c.pod.Name, c.container, c.count, m.Resource, n)
	}
	if len(fit) != 1 {
		return nil, fmt.Errorf("%w: cannot tell which pod this request for %d %s is for: %s; refusing rather than guessing", ErrNoMatch, n, m.Resource, describe(cands))
	}
	return m.target(fit[0], n)
}

// nextContainer returns the first container of the pod, init containers
// first, that asks for the resource and has not been served, and whether
// it is an init container.
func (m *Matcher) nextContainer(pod *v1.Pod, kp KubeletPod) (name string, init bool, count int64, ok bool) {
	for i, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for j := range cs {
			c := &cs[j]
			// A sidecar (restartable init container) runs with the app
			// containers and is recorded as one.
			init := i == 0 && !kubeobj.IsSidecar(c)
			n, err := kubeobj.Devices(c, m.Resource)
			if err != nil || n <= 0 || len(kp.Devices[c.Name]) > 0 {
				continue
			}
			// Served before, and the kubelet does not list its devices: an
			// init container (the pod-resources API never lists those), or
			// an app container whose answer the kubelet lost — it was
			// killed after we answered and before it recorded the answer,
			// which it does before it asks for anything else. That one is
			// asked for again and answered again, identically.
			if init && m.State.Served(pod.UID, c.Name) {
				continue
			}
			return c.Name, init, n, true
		}
	}
	return "", false, 0, false
}

// target reads the pod's allocation record for the container.
func (m *Matcher) target(p pending, n int) (*Target, error) {
	ref := kubeobj.Key(p.pod)
	var rec *api.PodAllocation
	var err error
	if m.Protocol != nil {
		if rec, err = m.Protocol.Record(p.pod); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrNoMatch, err)
		}
	} else {
		rec, err = kubeobj.Record(p.pod)
	}
	if errors.Is(err, kubeobj.ErrNoRecord) {
		return nil, fmt.Errorf("%w: pod %s has no %s annotation: it was not placed by the Tessera scheduler, and a GPU share without a record would run without limits", ErrNoMatch, ref, api.AnnotationAllocation)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: pod %s: %v", ErrNoMatch, ref, err)
	}
	if rec.Node != m.Node {
		return nil, fmt.Errorf("%w: pod %s: allocation record is for node %q, this is node %q", ErrNoMatch, ref, rec.Node, m.Node)
	}
	for _, c := range rec.Containers {
		if c.Name != p.container || c.Init != p.init {
			continue
		}
		if len(c.Devices) != n {
			return nil, fmt.Errorf("%w: pod %s container %s: allocation record grants %d GPUs, the kubelet asks for %d", ErrNoMatch, ref, p.container, len(c.Devices), n)
		}
		return &Target{Pod: p.pod, Container: p.container, Grant: c, Record: rec}, nil
	}
	return nil, fmt.Errorf("%w: pod %s: allocation record has no entry for container %s (init=%v)", ErrNoMatch, ref, p.container, p.init)
}

func describe(c []pending) string {
	s := make([]string, len(c))
	for i, p := range c {
		s[i] = fmt.Sprintf("%s/%s container %s wants %d", p.pod.Namespace, p.pod.Name, p.container, p.count)
	}
	sort.Strings(s)
	return fmt.Sprintf("%d pods are waiting (%s)", len(c), strings.Join(s, "; "))
}

// MarkServed records that the container was answered.
func (m *Matcher) MarkServed(uid types.UID, container string) (string, error) {
	return m.State.Create(uid, container)
}
