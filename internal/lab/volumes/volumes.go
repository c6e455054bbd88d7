// Package volumes is the lab's volume provisioner, so that pods with
// PersistentVolumeClaims bind and run as on a cluster with storage. The
// StorageClass "default" (the cluster's default class, named as the
// default class of AKS, which published manifests such as vLLM's name) has
// the provisioner tessera-lab.io/hostpath and binds when a pod uses the
// claim (WaitForFirstConsumer): the scheduler picks the pod's node and
// marks the claim (volume.kubernetes.io/selected-node), the controller
// manager's PersistentVolume controller hands it to the provisioner
// (volume.kubernetes.io/storage-provisioner), which makes a directory in
// the node's directory of the lab (nodes/<node>/volumes/pvc-<claim UID>)
// and a hostPath PersistentVolume of it, reserved for the claim and bound
// to the node; the controller binds the two. A released volume of the
// class (its claim deleted; reclaim policy Delete) is deleted with its
// directory. This is the external-provisioner protocol of Kubernetes'
// sig-storage provisioners, as Rancher's local-path-provisioner runs it,
// with the lab's directories for disks; like that provisioner, it makes
// the directories writable by every user (0777), since a hostPath volume
// is not chowned to a pod's fsGroup.
package volumes

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/lab/labdir"
)

// Provisioner is the StorageClass provisioner the lab serves.
const Provisioner = "tessera-lab.io/hostpath"

// ClassName is the lab's StorageClass.
const ClassName = "default"

// Annotations of the external-provisioner protocol.
const (
	annSelectedNode    = "volume.kubernetes.io/selected-node"
	annProvisioner     = "volume.kubernetes.io/storage-provisioner"
	annBetaProvisioner = "volume.beta.kubernetes.io/storage-provisioner"
	annProvisionedBy   = "pv.kubernetes.io/provisioned-by"
)

// Event reasons on claims, as the sig-storage provisioners post them.
const (
	ReasonProvisioned     = "ProvisioningSucceeded"
	ReasonProvisionFailed = "ProvisioningFailed"
)

// StorageClass is the lab's StorageClass, the cluster's default.
func StorageClass() *storagev1.StorageClass {
	bind := storagev1.VolumeBindingWaitForFirstConsumer
	reclaim := corev1.PersistentVolumeReclaimDelete
	return &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: ClassName, Annotations: map[string]string{
			"storageclass.kubernetes.io/is-default-class": "true",
		}},
		Provisioner: Provisioner, VolumeBindingMode: &bind, ReclaimPolicy: &reclaim,
	}
}

// EnsureStorageClass creates the StorageClass unless it exists.
func EnsureStorageClass(ctx context.Context, client kubernetes.Interface) error {
	_, err := client.StorageV1().StorageClasses().Create(ctx, StorageClass(), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// Controller provisions and deletes the lab's volumes.
type Controller struct {
	client   kubernetes.Interface
	lab      labdir.Dir
	claims   cache.Indexer
	volumes  cache.Indexer
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder
	logger   klog.Logger
}

// Keys of the queue: a claim's namespace/name, or a volume's name behind
// "pv/".
const volumeKey = "pv/"

// Run provisions until ctx ends.
func Run(ctx context.Context, client kubernetes.Interface, lab labdir.Dir) error {
	logger := klog.FromContext(ctx).WithName("volumes")
	f := informers.NewSharedInformerFactory(client, 10*time.Minute)
	claims, volumes := f.Core().V1().PersistentVolumeClaims().Informer(), f.Core().V1().PersistentVolumes().Informer()
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer b.Shutdown()
	c := &Controller{
		client: client, lab: lab, claims: claims.GetIndexer(), volumes: volumes.GetIndexer(),
		queue:    workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		recorder: b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: Provisioner}), logger: logger,
	}
	defer c.queue.ShutDown()
	enqueue := func(prefix string) cache.ResourceEventHandlerFuncs {
		add := func(obj any) {
			if k, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
				c.queue.Add(prefix + k)
			}
		}
		return cache.ResourceEventHandlerFuncs{AddFunc: add, UpdateFunc: func(_, o any) { add(o) }}
	}
	if _, err := claims.AddEventHandler(enqueue("")); err != nil {
		return err
	}
	if _, err := volumes.AddEventHandler(enqueue(volumeKey)); err != nil {
		return err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), claims.HasSynced, volumes.HasSynced) {
		return ctx.Err()
	}
	logger.Info("Provisioning volumes", "storageClass", ClassName, "provisioner", Provisioner)
	go wait.UntilWithContext(ctx, c.work, time.Second)
	<-ctx.Done()
	return nil
}

func (c *Controller) work(ctx context.Context) {
	for {
		key, quit := c.queue.Get()
		if quit {
			return
		}
		var err error
		if name, ok := strings.CutPrefix(key, volumeKey); ok {
			err = c.syncVolume(ctx, name)
		} else {
			err = c.syncClaim(ctx, key)
		}
		if err != nil {
			utilruntime.HandleErrorWithContext(ctx, err, "Syncing", "key", key)
			c.queue.AddRateLimited(key)
		} else {
			c.queue.Forget(key)
		}
		c.queue.Done(key)
	}
}

// VolumeName is the PersistentVolume made for a claim.
func VolumeName(claim *corev1.PersistentVolumeClaim) string { return "pvc-" + string(claim.UID) }

// syncClaim provisions a volume for a claim handed to the provisioner,
// once its pod's node is chosen.
func (c *Controller) syncClaim(ctx context.Context, key string) error {
	obj, ok, err := c.claims.GetByKey(key)
	if err != nil || !ok {
		return err
	}
	claim := obj.(*corev1.PersistentVolumeClaim)
	if claim.Spec.VolumeName != "" || claim.DeletionTimestamp != nil {
		return nil
	}
	p := claim.Annotations[annProvisioner]
	if p == "" {
		p = claim.Annotations[annBetaProvisioner]
	}
	node := claim.Annotations[annSelectedNode]
	if p != Provisioner || node == "" {
		return nil // another provisioner's, or waiting for its pod's node
	}
	name := VolumeName(claim)
	if _, exists, _ := c.volumes.GetByKey(name); exists {
		return nil
	}
	pv, err := c.volume(claim, node)
	if err != nil {
		c.recorder.Event(claim, corev1.EventTypeWarning, ReasonProvisionFailed, err.Error())
		return nil // the claim as written cannot be served: retrying changes nothing
	}
	dir := pv.Spec.HostPath.Path
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return fmt.Errorf("claim %s: %w", key, err)
	}
	if err := os.Chmod(dir, 0o777); err != nil { // past the umask
		return fmt.Errorf("claim %s: %w", key, err)
	}
	if _, err := c.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		c.recorder.Event(claim, corev1.EventTypeWarning, ReasonProvisionFailed, err.Error())
		return err
	}
	c.logger.Info("Provisioned", "claim", key, "volume", name, "node", node, "path", dir)
	c.recorder.Eventf(claim, corev1.EventTypeNormal, ReasonProvisioned, "Successfully provisioned volume %s (directory %s on node %s)", name, dir, node)
	return nil
}

// volume is the PersistentVolume for a claim on a node.
func (c *Controller) volume(claim *corev1.PersistentVolumeClaim, node string) (*corev1.PersistentVolume, error) {
	if claim.Spec.VolumeMode != nil && *claim.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		return nil, errors.New("volumeMode Block: the lab's volumes are directories (Filesystem only)")
	}
	if claim.Spec.DataSource != nil || claim.Spec.DataSourceRef != nil {
		return nil, errors.New("dataSource: the lab's provisioner makes empty volumes only")
	}
	size, ok := claim.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok {
		return nil, errors.New("spec.resources.requests.storage is required")
	}
	class := ClassName
	if claim.Spec.StorageClassName != nil {
		class = *claim.Spec.StorageClassName
	}
	name := VolumeName(claim)
	hostPathDir := corev1.HostPathDirectory
	fs := corev1.PersistentVolumeFilesystem
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{annProvisionedBy: Provisioner}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   claim.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              class,
			VolumeMode:                    &fs,
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{
				Path: filepath.Join(c.lab.Node(node).Volumes(), name), Type: &hostPathDir,
			}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
	}, nil
}

// syncVolume deletes a released volume of the provisioner, and its
// directory.
func (c *Controller) syncVolume(ctx context.Context, name string) error {
	obj, ok, err := c.volumes.GetByKey(name)
	if err != nil || !ok {
		return err
	}
	pv := obj.(*corev1.PersistentVolume)
	if pv.Annotations[annProvisionedBy] != Provisioner || pv.Status.Phase != corev1.VolumeReleased ||
		pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || pv.DeletionTimestamp != nil {
		return nil
	}
	if hp := pv.Spec.HostPath; hp != nil && filepath.Base(hp.Path) == name {
		if err := os.RemoveAll(hp.Path); err != nil {
			return fmt.Errorf("volume %s: %w", name, err)
		}
	}
	err = c.client.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pv.UID}})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	c.logger.Info("Deleted a released volume", "volume", name)
	return nil
}
