package scheduler

// Writing the allocation record: in the Binding when the profile binds
// GPU pods through this plugin (one API write sets node and record), or
// by a merge patch in PreBind when another plugin binds them.

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// recordInBinding reports whether the profile binds through this plugin
// (Tessera first among its bind plugins): then the record travels in the
// Binding and PreBind has nothing to do. Otherwise another binder binds
// GPU pods, and PreBind must write the record before it does.
func (p *Plugin) recordInBinding(logger klog.Logger) bool {
	p.bindOnce.Do(func() {
		lister, ok := p.handle.(interface{ ListPlugins() *schedconfig.Plugins })
		if !ok {
			return
		}
		if pl := lister.ListPlugins(); pl != nil && len(pl.Bind.Enabled) > 0 && pl.Bind.Enabled[0].Name == Name {
			p.bindsSelf = true
		}
		where := "PreBind"
		if p.bindsSelf {
			where = "Binding"
		}
		logger.Info("Where GPU allocation records are written", "writtenIn", where)
	})
	return p.bindsSelf
}

// reserved is the record Reserve made for the pod.
func reserved(s *cycleState, pod *corev1.Pod) (*api.PodAllocation, *fwk.Status) {
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	if rec == nil {
		return nil, fwk.AsStatus(fmt.Errorf("no GPUs reserved for pod %s", kubeobj.Key(pod)))
	}
	return rec, nil
}

func (p *Plugin) apiCacher() fwk.APICacher {
	if p.handle == nil {
		return nil
	}
	return p.handle.APICacher()
}

func bindingWithRecord(pod *corev1.Pod, nodeName string, rec *api.PodAllocation) (*corev1.Binding, error) {
	data, err := api.EncodeAllocation(rec)
	if err != nil {
		return nil, err
	}
	return &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
			Annotations: map[string]string{api.AnnotationAllocation: string(data)},
		},
		Target: corev1.ObjectReference{Kind: "Node", Name: nodeName},
	}, nil
}

// transient errors are worth the same request again.
func transient(err error) bool {
	return apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsTimeout(err)
}

// createBinding creates the binding, retrying transient errors. An
// attempt that timed out may still have bound the pod, so an error is
// checked against the pod itself: bound to the target with this record
// and UID is success.
func createBinding(ctx context.Context, client kubernetes.Interface, b *corev1.Binding) error {
	pods := client.CoreV1().Pods(b.Namespace)
	err := retry.OnError(retry.DefaultBackoff, transient, func() error {
		return pods.Bind(ctx, b, metav1.CreateOptions{})
	})
	if err == nil {
		return nil
	}
	if cur, gerr := pods.Get(ctx, b.Name, metav1.GetOptions{}); gerr == nil && cur.UID == b.UID &&
		cur.Spec.NodeName == b.Target.Name && cur.Annotations[api.AnnotationAllocation] == b.Annotations[api.AnnotationAllocation] {
		return nil
	}
	return fmt.Errorf("binding pod %s/%s to %s with its GPU allocation record: %w", b.Namespace, b.Name, b.Target.Name, err)
}

// WriteRecord sets the allocation annotation on the pod with the given UID,
// retrying on conflicts and transient server errors.
func WriteRecord(ctx context.Context, client kubernetes.Interface, namespace, name string, uid types.UID, rec *api.PodAllocation) error {
	data, err := api.EncodeAllocation(rec)
	if err != nil {
		return err
	}
	patch, err := jsonMergePatch(uid, string(data))
	if err != nil {
		return err
	}
	retriable := func(err error) bool { return apierrors.IsConflict(err) || transient(err) }
	err = retry.OnError(retry.DefaultBackoff, retriable, func() error {
		_, err := client.CoreV1().Pods(namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("writing the GPU allocation record on pod %s/%s: %w", namespace, name, err)
	}
	return nil
}

// jsonMergePatch sets the allocation annotation; the UID makes the patch
// fail on a pod recreated under the same name instead of annotating it.
func jsonMergePatch(uid types.UID, record string) ([]byte, error) {
	return json.Marshal(map[string]any{
		"metadata": map[string]any{
			"uid":         uid,
			"annotations": map[string]string{api.AnnotationAllocation: record},
		},
	})
}
