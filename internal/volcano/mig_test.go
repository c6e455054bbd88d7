package volcano

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/mig"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// shipped is deploy/volcano/device-config.yaml's configuration.
func shipped(t *testing.T) *DeviceConfig {
	t.Helper()
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(deploy.VolcanoDeviceConfig, &cm); err != nil {
		t.Fatal(err)
	}
	if cm.Namespace != api.VolcanoDeviceConfigNamespace || cm.Name != api.VolcanoDeviceConfigName {
		t.Errorf("the shipped ConfigMap is %s/%s, Volcano reads %s/%s", cm.Namespace, cm.Name, api.VolcanoDeviceConfigNamespace, api.VolcanoDeviceConfigName)
	}
	c, err := ParseDeviceConfig(cm.Data[api.VolcanoDeviceConfigKey])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestShippedDeviceConfig: every group of the shipped geometries fits its
// GPU as a whole (each position a distinct instance, all of them at once),
// and Volcano never counts more memory for a profile than the GPU's
// instance gives (else a node refuses what Volcano placed).
func TestShippedDeviceConfig(t *testing.T) {
	c := shipped(t)
	for product, model := range map[string]string{
		"NVIDIA A100-SXM4-40GB": "A100-40GB", "NVIDIA A100-SXM4-80GB": "A100-80GB", "NVIDIA H100 80GB HBM3": "H100-80GB",
	} {
		m, _ := mig.ModelByName(model)
		gs, ok := c.Geometries(RegisteredType(product))
		if !ok {
			t.Errorf("%s: no geometries", product)
			continue
		}
		for _, g := range gs {
			var all []mig.Instance
			n := 0
			for _, tp := range g.Templates {
				n += tp.Count
			}
			for pos := range n {
				in, prof, err := ResolveMIG(m, gs, MIGPosition{Group: g.Group, Position: pos})
				if err != nil {
					t.Fatalf("%s %s-%d: %v", model, g.Group, pos, err)
				}
				all = append(all, in)
				for _, tp := range g.Templates {
					if tp.Name == prof.Name && tp.MemoryMiB > prof.MemoryMiB {
						t.Errorf("%s %s: %s counted %d MiB, the instance gives %d", model, g.Group, tp.Name, tp.MemoryMiB, prof.MemoryMiB)
					}
				}
			}
			if err := m.Validate(all); err != nil {
				t.Errorf("%s %s: the positions' instances %v do not fit together: %v", model, g.Group, all, err)
			}
		}
	}
}

// TestResolveMIG: Volcano's positions count the group's instances in the
// order it lists them; each names the instance of its profile at that
// rank among the group's arrangement on the GPU.
func TestResolveMIG(t *testing.T) {
	c := shipped(t)
	m, _ := mig.ModelByName("A100-40GB")
	gs, _ := c.Geometries(RegisteredType("Mock NVIDIA A100-SXM4-40GB"))
	for pos, want := range []string{"2g.10gb@0", "2g.10gb@2", "2g.10gb@4", "1g.5gb@6"} {
		in, prof, err := ResolveMIG(m, gs, MIGPosition{Group: "group2", Position: pos})
		if err != nil || in.String() != want || prof.Name != in.Profile {
			t.Errorf("group2-%d: %v %v %v, want %s", pos, in, prof, err, want)
		}
	}
	for _, bad := range []struct {
		p    MIGPosition
		want string
	}{
		{MIGPosition{Group: "group7"}, `group "group7" is not one of the groups Volcano's device configuration gives A100-40GB (group1, group2, group3, group4)`},
		{MIGPosition{Group: "group3", Position: 2}, "position 2 is past group group3's 2 instances"},
	} {
		if _, _, err := ResolveMIG(m, gs, bad.p); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: %v, want %q", bad.p, err, bad.want)
		}
	}
	// A group that cannot be arranged on the GPU is named.
	over := []MIGGeometry{{Group: "big", Templates: []MIGTemplate{{Name: "3g.20gb", MemoryMiB: 19968, Count: 3}}}}
	if _, _, err := ResolveMIG(m, over, MIGPosition{Group: "big"}); err == nil || !strings.Contains(err.Error(), "group big of Volcano's device configuration") {
		t.Errorf("3 × 3g.20gb: %v", err)
	}
	if _, ok := c.Geometries(RegisteredType("NVIDIA A30-PCIE-24GB")); ok {
		t.Error("geometries for an A30, which the configuration does not list")
	}
}

// TestParseDeviceConfig refuses geometries Volcano's position format or a
// GPU cannot carry, naming where.
func TestParseDeviceConfig(t *testing.T) {
	for _, bad := range []struct{ in, want string }{
		{"nvidia: [", "device-config.yaml"},
		{"nvidia:\n  knownMigGeometries:\n  - models: []\n", "knownMigGeometries[0]: models must name GPU models"},
		{"nvidia:\n  knownMigGeometries:\n  - models: [A100]\n    allowedGeometries:\n    - group: group-1\n      geometries: [{name: 1g.5gb, memory: 4864, count: 7}]\n",
			`allowedGeometries[0]: group "group-1" must be a name without '-'`},
		{"nvidia:\n  knownMigGeometries:\n  - models: [A100]\n    allowedGeometries:\n    - group: g\n      geometries: [{name: 1c.2g.10gb, memory: 4864, count: 7}]\n",
			"allowedGeometries[0].geometries[0]: MIG profile"},
		{"nvidia:\n  knownMigGeometries:\n  - models: [A100]\n    allowedGeometries:\n    - group: g\n      geometries: [{name: 1g.5gb, memory: 4864, count: 0}]\n",
			"1g.5gb count 0"},
	} {
		if _, err := ParseDeviceConfig(bad.in); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: %v, want %q", bad.in, err, bad.want)
		}
	}
}

// TestMatchMIG: on a GPU registered in mig mode, a position is checked by
// the node's instance check and a share is refused; Record turns a
// position into the MIG grant of its instance.
func TestMatchMIG(t *testing.T) {
	gpu := func(u string) (GPUInfo, bool) { return GPUInfo{MemoryMiB: 40960, MIG: true}, u == gpuA }
	ask := container("c", map[string]string{api.VolcanoVGPUNumber: "1", api.VolcanoVGPUMemory: "9000"})
	checked := 0
	check := func(d Device) error {
		checked++
		if d.MIG.Group != "group2" {
			return errTest
		}
		return nil
	}
	p := podOf(map[string]string{api.AnnotationVolcanoNode: "n", api.AnnotationVolcanoIDs: gpuA + "[group2-1],NVIDIA,9000,0:"}, ask)
	if err := Match(p, gpu, check); err != nil || checked != 1 {
		t.Fatalf("%v (checked %d)", err, checked)
	}
	rec, err := Record(p, func(d Device) api.MIGGrant { return api.MIGGrant{Profile: "2g.10gb", Start: 2 * d.MIG.Position} })
	if err != nil || *rec.Containers[0].Devices[0].MIG != (api.MIGGrant{Profile: "2g.10gb", Start: 2}) || rec.Containers[0].Devices[0].UUID != gpuA {
		t.Errorf("record %+v, %v", rec, err)
	}
	p.Annotations[api.AnnotationVolcanoIDs] = gpuA + "[group1-1],NVIDIA,9000,0:"
	if err := Match(p, gpu, check); err == nil || !strings.Contains(err.Error(), "[group1-1]: "+errTest.Error()) {
		t.Errorf("the instance check's refusal: %v", err)
	}
	if err := Match(p, gpu, nil); err == nil || !strings.Contains(err.Error(), "serves no MIG instances") {
		t.Errorf("no instance check: %v", err)
	}
	p.Annotations[api.AnnotationVolcanoIDs] = gpuA + ",NVIDIA,9000,0:"
	if err := Match(p, gpu, check); err == nil || !strings.Contains(err.Error(), "registered in mode mig") {
		t.Errorf("a share on a GPU in mig mode: %v", err)
	}
}

var errTest = errors.New("not this group")
