package lab

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/internal/lab/modes"
	"github.com/tessera-gpu/tessera/internal/lab/poll"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// The lab is ready for Volcano's pods once Volcano's scheduler has read
// each volcano node's vGPUs (its handshake request), not when the agent
// has registered them: a registration alone times out, naming the node;
// Volcano's request ends the wait, and a DRA node is not waited for.
func TestWaitVolcanoSees(t *testing.T) {
	nodes := []modes.NodeSpec{{Name: "v", Mode: modes.VolcanoMode}, {Name: "d", Mode: "dra"}}
	node := func(name, handshake string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{
			api.AnnotationVolcanoRegister:  "GPU-1,10,40960,NVIDIA-A100,true,hami-core:",
			api.AnnotationVolcanoHandshake: handshake,
		}}}
	}
	none := func() error { return nil }
	ctx := context.Background()

	client := fake.NewClientset(node("v", "Reported_2026.11.28 07:00:00"), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "d"}})
	err := waitVolcanoSees(ctx, client, nodes, time.Second, "volcano-scheduler.log", none)
	if !errors.Is(err, poll.ErrTimeout) || !strings.Contains(err.Error(), "node v ") || strings.Contains(err.Error(), "node d") {
		t.Fatalf("registered, not yet read by Volcano: %v", err)
	}

	go func() {
		time.Sleep(300 * time.Millisecond)
		_, _ = client.CoreV1().Nodes().Update(ctx, node("v", api.VolcanoHandshakeRequesting+"2026.11.28 07:00:01"), metav1.UpdateOptions{})
	}()
	if err := waitVolcanoSees(ctx, client, nodes, 10*time.Second, "volcano-scheduler.log", none); err != nil {
		t.Fatalf("after Volcano's request: %v", err)
	}

	crash := errors.New("volcano-scheduler keeps exiting")
	client = fake.NewClientset(node("v", "Reported_2026.11.28 07:00:00"))
	if err := waitVolcanoSees(ctx, client, nodes, 10*time.Second, "volcano-scheduler.log", func() error { return crash }); !errors.Is(err, crash) {
		t.Fatalf("a crashing component: %v", err)
	}
}
