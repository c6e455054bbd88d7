package config

import (
	"os"
	"testing"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// TestShippedConfigMap parses every profile of the example ConfigMap.
func TestShippedConfigMap(t *testing.T) {
	b, err := os.ReadFile("../../../deploy/node-agent/configmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm v1.ConfigMap
	if err := yaml.UnmarshalStrict(b, &cm); err != nil {
		t.Fatal(err)
	}
	want := map[string]api.SharingMode{"default": api.SharingShared, "exclusive": api.SharingExclusive, "dense": api.SharingShared,
		"nvidia-time-slicing": api.SharingTimeSlicing, "nvidia-mps": api.SharingMPS, "nvidia-mig": api.SharingMIG, "mig-dynamic": api.SharingMIGDynamic}
	if len(cm.Data) != len(want)+1 {
		t.Errorf("profiles %v", cm.Data)
	}
	if _, err := ParseMIGParted([]byte(cm.Data["mig-parted"])); err != nil {
		t.Errorf("mig-parted: %v", err)
	}
	for name, mode := range want {
		labels := map[string]string{api.LabelNodeConfig: name}
		if mode == api.SharingMIG {
			labels[api.LabelMIGConfig] = "all-1g.5gb"
		}
		_, c, err := Resolve(cm.Data, labels, api.DefaultResourceNames)
		if err != nil {
			t.Errorf("profile %s: %v", name, err)
			continue
		}
		if c.Sharing != mode {
			t.Errorf("profile %s: sharing %s, want %s", name, c.Sharing, mode)
		}
	}
	s := NewStore(api.DefaultResourceNames)
	if _, err := s.Update(cm.Data, map[string]string{api.LabelNodeConfig: "nvidia-time-slicing"}); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.Current(); c.SharesPerGPU != 4 {
		t.Errorf("%+v", c)
	}
}
