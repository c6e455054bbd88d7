package parts

// Volcano's mig mode on a node whose profile says mode volcano and
// sharing mig-dynamic (docs/volcano.md, "MIG mode"): the GPUs in MIG mode
// are registered in Volcano's mode "mig"; Volcano's scheduler picks a
// geometry group of its device configuration for each GPU and a position
// in it for each container; the agent finds the instance in the same
// configuration, holds it to the container's request and to the
// instances it already serves, and the MIG part creates it (or finds it)
// when the kubelet asks.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/mig"
	"github.com/tessera-gpu/tessera/internal/volcano"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// ReasonVolcanoMIGConfig is the reason of the Node's Warning event when
// Volcano's device configuration gives a GPU in mig mode no geometry the
// agent can use.
const ReasonVolcanoMIGConfig = "VolcanoMIGGeometryMissing"

// deviceConfigTTL is how long a read of Volcano's device configuration
// is used (Volcano's scheduler reads it once, at its start).
const deviceConfigTTL = 5 * time.Second

type deviceConfigCache struct {
	at  time.Time
	cfg *volcano.DeviceConfig
	err error
}

// deviceConfig reads Volcano's device configuration (at most every
// deviceConfigTTL).
func (v *Volcano) deviceConfig(ctx context.Context) (*volcano.DeviceConfig, error) {
	v.mu.Lock()
	c := v.cfgCache
	v.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < deviceConfigTTL {
		return c.cfg, c.err
	}
	c = deviceConfigCache{at: time.Now()}
	ref := v.opts.DeviceConfig
	cm, err := v.opts.Client.CoreV1().ConfigMaps(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case err != nil:
		c.err = fmt.Errorf("reading Volcano's device configuration, ConfigMap %s: %v", ref, err)
	case cm.Data[api.VolcanoDeviceConfigKey] == "":
		c.err = fmt.Errorf("ConfigMap %s has no %s (Volcano's scheduler then knows no MIG geometries)", ref, api.VolcanoDeviceConfigKey)
	default:
		if c.cfg, c.err = volcano.ParseDeviceConfig(cm.Data[api.VolcanoDeviceConfigKey]); c.err != nil {
			c.err = fmt.Errorf("ConfigMap %s: %v", ref, c.err)
		}
	}
	v.mu.Lock()
	v.cfgCache = c
	v.mu.Unlock()
	return c.cfg, c.err
}

// migGPU is what the volcano part knows of a GPU: NVML's model and its
// MIG geometry, fixed for the agent's life.
type migGPU struct {
	uuid, model string
	geometry    *mig.Model
}

// migGPUsOf reads the GPUs' models once: the MIG part reads the volcano
// part's records while it holds the devices' lock.
func migGPUsOf(d *Devices) map[string]migGPU {
	out := map[string]migGPU{}
	if d == nil {
		return out
	}
	for _, dev := range d.List() {
		out[dev.GPU.UUID] = migGPU{uuid: dev.GPU.UUID, model: dev.GPU.Model, geometry: dev.MIG}
	}
	return out
}

// migDevice returns the GPU and its MIG geometry.
func (v *Volcano) migDevice(uuid string) (migGPU, error) {
	g, ok := v.gpus[uuid]
	switch {
	case !ok:
		return migGPU{}, fmt.Errorf("GPU %s is not a GPU of this node", uuid)
	case g.geometry == nil:
		return g, fmt.Errorf("GPU %s (%s) has no MIG geometry Tessera knows", uuid, g.model)
	}
	return g, nil
}

// geometries are the groups Volcano's configuration gives the GPU.
func (v *Volcano) geometries(ctx context.Context, d migGPU) ([]volcano.MIGGeometry, error) {
	cfg, err := v.deviceConfig(ctx)
	if err != nil {
		return nil, err
	}
	t := volcano.RegisteredType(d.model)
	gs, ok := cfg.Geometries(t)
	if !ok {
		return nil, fmt.Errorf("ConfigMap %s lists no MIG geometries (nvidia.knownMigGeometries) for %s: Volcano's scheduler treats GPU %s as %s and grants shares this node cannot serve", v.opts.DeviceConfig, t, d.uuid, api.VolcanoModeHAMiCore)
	}
	return gs, nil
}

// instance is the MIG instance Volcano's position names on its GPU.
func (v *Volcano) instance(ctx context.Context, d volcano.Device) (mig.Instance, *mig.Profile, *mig.Model, error) {
	if d.MIG == nil {
		return mig.Instance{}, nil, nil, fmt.Errorf("GPU %s: no MIG position", d.UUID)
	}
	dev, err := v.migDevice(d.UUID)
	if err != nil {
		return mig.Instance{}, nil, nil, err
	}
	gs, err := v.geometries(ctx, dev)
	if err != nil {
		return mig.Instance{}, nil, nil, err
	}
	in, prof, err := volcano.ResolveMIG(dev.geometry, gs, *d.MIG)
	if err != nil {
		return mig.Instance{}, nil, nil, fmt.Errorf("ConfigMap %s: %v", v.opts.DeviceConfig, err)
	}
	return in, prof, dev.geometry, nil
}

// held is a MIG instance this node serves to a container.
type held struct {
	inst      mig.Instance
	pod       string
	container string
}

// checkInstance holds a MIG position to the container's request (the
// instance has at least the memory asked) and to what the node serves:
// no container of another live pod on the node was served an instance
// of the GPU that it overlaps.
func (v *Volcano) checkInstance(pod *v1.Pod, d volcano.Device) error {
	ctx := context.Background()
	in, prof, model, err := v.instance(ctx, d)
	if err != nil {
		return err
	}
	if prof.MemoryMiB < d.MemoryMiB {
		return fmt.Errorf("instance %s has %d MiB, the container asks for %d MiB (ConfigMap %s counts more memory for %s than the GPU gives)", in, prof.MemoryMiB, d.MemoryMiB, v.opts.DeviceConfig, prof.Name)
	}
	for _, h := range v.served(ctx, pod.UID, d.UUID) {
		if err := model.Validate([]mig.Instance{h.inst, in}); err != nil {
			return fmt.Errorf("instance %s overlaps %s, which this node serves to pod %s container %s", in, h.inst, h.pod, h.container)
		}
	}
	return nil
}

// served are the MIG instances of GPU uuid this node has served to the
// containers of the live pods other than pod (their annotations, for the
// containers the state directories record as served).
func (v *Volcano) served(ctx context.Context, pod types.UID, uuid string) []held {
	v.mu.Lock()
	lister := v.pods
	v.mu.Unlock()
	if lister == nil {
		return nil
	}
	list, err := lister.List(labels.Everything())
	if err != nil {
		return nil
	}
	var out []held
	for _, p := range list {
		if p.UID == pod || gone(p) || p.Annotations[api.AnnotationVolcanoNode] != v.opts.NodeName {
			continue
		}
		rec, err := volcano.Record(p, nil)
		if err != nil {
			continue
		}
		pd, _ := volcano.DecodePodDevices(p.Annotations[api.AnnotationVolcanoIDs]) // Record decoded it
		for i, c := range rec.Containers {
			if !v.opts.State.Served(p.UID, c.Name) {
				continue
			}
			for _, d := range pd[i] {
				if d.UUID != uuid || d.MIG == nil {
					continue
				}
				if in, _, _, err := v.instance(ctx, d); err == nil {
					out = append(out, held{inst: in, pod: kubeobj.Key(p), container: c.Name})
				}
			}
		}
	}
	return out
}

// checkGeometries reports, in the log and as a Warning event on the
// Node, a GPU registered in mig mode that Volcano's configuration gives
// no usable geometry (Volcano's scheduler would fall back to hami-core
// for it, whose grants the agent refuses), once per change.
func (v *Volcano) checkGeometries(ctx context.Context, gpus []volcano.RegisteredGPU) {
	var problems []string
	for _, g := range gpus {
		if g.Mode != api.VolcanoModeMIG {
			continue
		}
		dev, err := v.migDevice(g.UUID)
		var gs []volcano.MIGGeometry
		if err == nil {
			gs, err = v.geometries(ctx, dev)
		}
		for i := 0; err == nil && i < len(gs); i++ {
			_, _, err = volcano.ResolveMIG(dev.geometry, gs, volcano.MIGPosition{Group: gs[i].Group})
			if err != nil {
				err = fmt.Errorf("ConfigMap %s: %v", v.opts.DeviceConfig, err)
			}
		}
		if err != nil && !slices.Contains(problems, err.Error()) {
			problems = append(problems, err.Error())
		}
	}
	problem := strings.Join(problems, "; ")
	v.mu.Lock()
	was, recorder := v.problem, v.recorder
	v.problem = problem
	v.mu.Unlock()
	switch {
	case problem == was:
	case problem == "":
		v.opts.Logger.Info("Volcano's device configuration has the MIG geometries of the node's GPUs", "configMap", v.opts.DeviceConfig.String())
	default:
		v.opts.Logger.Error(nil, "Volcano's MIG mode: pods placed on these GPUs will be refused", "problem", problem)
		if recorder != nil {
			node := &v1.ObjectReference{Kind: "Node", Name: v.opts.NodeName, UID: types.UID(v.opts.NodeName)}
			recorder.Event(node, v1.EventTypeWarning, ReasonVolcanoMIGConfig, problem)
		}
	}
}
