package labdir

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/atomicfile"
	"github.com/tessera-gpu/tessera/internal/hollowkubelet"
)

// What each node's runtime records of its containers: one file per
// container of a pod (ContainerRecord), the latest created, removed with
// the container.

// WriteContainer records a container.
func (n NodeDir) WriteContainer(c hollowkubelet.Container) error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(n.ContainerRecord(c.Namespace, c.Pod, c.Name), b, 0o644)
}

// RemoveContainer removes a container's record, unless a later container
// of that name in that pod has replaced it.
func (n NodeDir) RemoveContainer(c hollowkubelet.Container) {
	path := n.ContainerRecord(c.Namespace, c.Pod, c.Name)
	if cur, err := ReadContainer(path); err == nil && cur.ID == c.ID {
		_ = os.Remove(path)
	}
}

// Container reads what the node's runtime recorded for a container (the
// latest creation, after restarts).
func (n NodeDir) Container(namespace, pod, container string) (*hollowkubelet.Container, error) {
	return ReadContainer(n.ContainerRecord(namespace, pod, container))
}

// ContainerOf reads what the runtimes recorded for a container of a pod
// in the default namespace, on whichever node it ran.
func (d Dir) ContainerOf(pod, container string) (*hollowkubelet.Container, error) {
	matches, err := filepath.Glob(d.Node("*").ContainerRecord(metav1.NamespaceDefault, pod, container))
	if err != nil || len(matches) == 0 {
		return nil, fmt.Errorf("no container %s of pod %s recorded in %s", container, pod, d)
	}
	return ReadContainer(matches[0])
}

// ReadContainer reads a container's record.
func ReadContainer(path string) (*hollowkubelet.Container, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c hollowkubelet.Container
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &c, nil
}
