package hollowkubelet

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	apitest "k8s.io/cri-api/pkg/apis/testing"
)

// Container is what the fake runtime was asked to create: the pod it
// belongs to and the environment, mounts and devices the kubelet put in it
// (among them what the device plugin's Allocate returned).
type Container struct {
	Namespace string            `json:"namespace"`
	Pod       string            `json:"pod"`
	PodUID    string            `json:"podUID"`
	Name      string            `json:"name"`
	Env       map[string]string `json:"env"`
	Mounts    []Mount           `json:"mounts,omitempty"`
	Devices   []string          `json:"devices,omitempty"`
	Created   time.Time         `json:"created"`
}

// Mount is one bind mount of a container.
type Mount struct {
	HostPath      string `json:"hostPath"`
	ContainerPath string `json:"containerPath"`
	ReadOnly      bool   `json:"readOnly,omitempty"`
}

// InitNames returns the names of a pod's init containers.
type InitNames func(ctx context.Context, namespace, pod, uid string) (sets.Set[string], error)

// recordingRuntime reports every container created, and makes init
// containers exit successfully once started so that the kubelet goes on
// to the app containers (the fake runtime never ends a container itself).
type recordingRuntime struct {
	internalapi.RuntimeService
	fake     *apitest.FakeRuntimeService
	onCreate func(Container)
	initOf   InitNames

	mu   sync.Mutex
	byID map[string]Container
}

func (r *recordingRuntime) CreateContainer(ctx context.Context, sandbox string, cfg *runtimeapi.ContainerConfig, sb *runtimeapi.PodSandboxConfig) (string, error) {
	id, err := r.RuntimeService.CreateContainer(ctx, sandbox, cfg, sb)
	if err != nil {
		return id, err
	}
	c := Container{
		Namespace: sb.GetMetadata().GetNamespace(), Pod: sb.GetMetadata().GetName(), PodUID: sb.GetMetadata().GetUid(),
		Name: cfg.GetMetadata().GetName(), Env: map[string]string{}, Created: time.Now(),
	}
	for _, e := range cfg.Envs {
		c.Env[e.Key] = string(e.Value)
	}
	for _, m := range cfg.Mounts {
		c.Mounts = append(c.Mounts, Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, ReadOnly: m.Readonly})
	}
	for _, d := range cfg.Devices {
		c.Devices = append(c.Devices, d.HostPath)
	}
	r.mu.Lock()
	r.byID[id] = c
	r.mu.Unlock()
	if r.onCreate != nil {
		r.onCreate(c)
	}
	return id, nil
}

func (r *recordingRuntime) StartContainer(ctx context.Context, id string) error {
	if err := r.RuntimeService.StartContainer(ctx, id); err != nil {
		return err
	}
	r.mu.Lock()
	c, ok := r.byID[id]
	r.mu.Unlock()
	if !ok || r.initOf == nil {
		return nil
	}
	inits, err := r.initOf(ctx, c.Namespace, c.Pod, c.PodUID)
	if err != nil || !inits.Has(c.Name) {
		return nil
	}
	r.fake.Lock()
	defer r.fake.Unlock()
	if fc, ok := r.fake.Containers[id]; ok {
		fc.State = runtimeapi.ContainerState_CONTAINER_EXITED
		fc.FinishedAt = time.Now().UnixNano()
		fc.ExitCode = 0
		fc.Reason = "Completed"
	}
	return nil
}
