package volumes

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/testenv/poll"
)

func claim(name, uid, node string, mode corev1.PersistentVolumeMode) *corev1.PersistentVolumeClaim {
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(uid), Annotations: map[string]string{annProvisioner: Provisioner}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: &mode,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("50Gi")}},
		},
	}
	if node != "" {
		c.Annotations[annSelectedNode] = node
	}
	return c
}

// TestProvisionAndDelete: a claim handed to the provisioner once its
// pod's node is chosen gets a directory on that node and a hostPath
// volume reserved for it, bound to the node; a claim still waiting for
// its node gets nothing; a block claim is refused with an event; a
// released volume goes with its directory.
func TestProvisionAndDelete(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset()
	lab := labdir.Dir(t.TempDir())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, client, lab) }()
	defer func() { cancel(); <-done }()

	claims := client.CoreV1().PersistentVolumeClaims("ns")
	for _, c := range []*corev1.PersistentVolumeClaim{
		claim("waiting", "u-waiting", "", corev1.PersistentVolumeFilesystem),
		claim("block", "u-block", "n1", corev1.PersistentVolumeBlock),
		claim("data", "u-data", "n1", corev1.PersistentVolumeFilesystem),
	} {
		if _, err := claims.Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var pv *corev1.PersistentVolume
	poll.Until(t, "the volume of claim data", 10*time.Second, func() bool {
		var err error
		pv, err = client.CoreV1().PersistentVolumes().Get(ctx, "pvc-u-data", metav1.GetOptions{})
		return err == nil
	})
	dir := filepath.Join(lab.Node("n1").Volumes(), "pvc-u-data")
	if pv.Spec.HostPath == nil || pv.Spec.HostPath.Path != dir || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != "u-data" ||
		pv.Spec.StorageClassName != ClassName || pv.Spec.Capacity.Storage().String() != "50Gi" ||
		pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values[0] != "n1" {
		t.Fatalf("volume %+v", pv.Spec)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o777 {
		t.Fatalf("directory %s: %v %v", dir, fi, err)
	}
	var events []string
	poll.Until(t, "the refusal of the block claim", 10*time.Second, func() bool {
		evs, _ := client.CoreV1().Events("ns").List(ctx, metav1.ListOptions{})
		events = events[:0]
		for _, e := range evs.Items {
			events = append(events, e.Reason+" "+e.InvolvedObject.Name+": "+e.Message)
		}
		return strings.Contains(strings.Join(events, "\n"), ReasonProvisionFailed+" block: volumeMode Block")
	})
	// Claims are synced in order: by now, the one waiting for its node
	// was looked at and got nothing.
	if list, _ := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{}); len(list.Items) != 1 {
		t.Errorf("volumes %v, want only claim data's", list.Items)
	}

	pv.Status.Phase = corev1.VolumeReleased
	if _, err := client.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the released volume deleted", 10*time.Second, func() bool {
		_, err := client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		_, serr := os.Stat(dir)
		return err != nil && os.IsNotExist(serr)
	})
}
