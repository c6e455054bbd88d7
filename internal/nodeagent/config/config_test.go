package config

import (
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/api"
)

var names = api.DefaultResourceNames

func TestParseTessera(t *testing.T) {
	c, err := Parse([]byte("sharesPerGPU: 4\nmemoryOvercommit: 1.5\nexcludeGPUs: [\"3\", GPU-abc]\n"), names)
	if err != nil {
		t.Fatal(err)
	}
	if c.SharesPerGPU != 4 || c.MemoryOvercommit != 1.5 || c.Sharing != api.SharingShared || len(c.ExcludeGPUs) != 2 {
		t.Errorf("%+v", c)
	}
	c, err = Parse([]byte(`{"sharing":"exclusive"}`), names)
	if err != nil || c.SharesPerGPU != 1 || c.Sharing != api.SharingExclusive {
		t.Errorf("%+v %v", c, err)
	}
	c, err = Parse([]byte(""), names)
	if err != nil || c.SharesPerGPU != api.DefaultSharesPerGPU {
		t.Errorf("empty profile: %+v %v", c, err)
	}
}

func TestParseNVIDIATimeSlicing(t *testing.T) {
	// As NVIDIA documents it, flags section included.
	doc := `version: v1
flags:
  migStrategy: none
sharing:
  timeSlicing:
    renameByDefault: false
    failRequestsGreaterThanOne: false
    resources:
    - name: nvidia.com/gpu
      replicas: 4
`
	c, err := Parse([]byte(doc), names)
	if err != nil {
		t.Fatal(err)
	}
	if c.Sharing != api.SharingTimeSlicing || c.SharesPerGPU != 4 || c.MemoryOvercommit != 1 {
		t.Errorf("%+v", c)
	}
	c, err = Parse([]byte("version: v1\nflags:\n  migStrategy: none\n"), names)
	if err != nil || c.Sharing != api.SharingExclusive {
		t.Errorf("no sharing section: %+v %v", c, err)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tt := range []struct{ doc, want string }{
		{"sharesPerGPU: 500", "sharesPerGPU 500 outside [1, 128]"},
		{"sharesPerGPU: 3\nsharing: exclusive", "sharesPerGPU 3 with exclusive sharing (must be 1)"},
		{"memoryOvercommit: 9", "memoryOvercommit 9 outside [1, 4]"},
		{"sharing: vgpu", `sharing "vgpu" is not one of`},
		{"shares: 3", `unknown field "shares"`},
		{"[1, 2", "not YAML or JSON"},
		{"version: v2\nsharing:\n  timeSlicing:\n    resources: []", `version "v2" is not supported (want "v1")`},
		{"version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 0", "replicas 0 outside [1, 128]"},
		{"version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: example.com/gpu\n      replicas: 2", `the agent serves "nvidia.com/gpu"; sharing another resource is not supported`},
		{"version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n      devices: [0]", "only \"all\" is supported"},
		{strings.Repeat("#", MaxProfileBytes+1), "more than the limit of 65536"},
	} {
		_, err := Parse([]byte(tt.doc), names)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%q) = %v, want %q", tt.doc, err, tt.want)
		}
	}
}

func TestStoreKeepsLastGood(t *testing.T) {
	s := NewStore(names)
	if c, _ := s.Current(); c.SharesPerGPU != api.DefaultSharesPerGPU {
		t.Fatalf("initial %+v", c)
	}
	data := map[string]string{"default": "sharesPerGPU: 5", "big": "sharesPerGPU: 20\nmemoryOvercommit: 2"}
	changed, err := s.Update(data, nil)
	if err != nil || !changed {
		t.Fatalf("changed %v err %v", changed, err)
	}
	if changed, _ := s.Update(data, nil); changed {
		t.Error("same data reported as a change")
	}
	if _, err := s.Update(data, map[string]string{api.LabelNodeConfig: "big"}); err != nil {
		t.Fatal(err)
	}
	if c, p := s.Current(); c.SharesPerGPU != 20 || p != "big" {
		t.Errorf("%+v %s", c, p)
	}
	// Bad profile, missing profile: errors, last good stays.
	data["big"] = "sharesPerGPU: -1"
	if _, err := s.Update(data, map[string]string{api.LabelNodeConfig: "big"}); err == nil || !strings.Contains(err.Error(), `profile "big": sharesPerGPU -1 outside [1, 128]`) {
		t.Errorf("err %v", err)
	}
	if _, err := s.Update(data, map[string]string{api.LabelNodeConfig: "nope"}); err == nil || !strings.Contains(err.Error(), `names no profile; the ConfigMap has keys "big", "default"`) {
		t.Errorf("err %v", err)
	}
	if _, err := s.Update(map[string]string{"a": "", "b": ""}, nil); err == nil || !strings.Contains(err.Error(), `no "default" profile`) {
		t.Errorf("err %v", err)
	}
	if c, p := s.Current(); c.SharesPerGPU != 20 || p != "big" {
		t.Errorf("last good lost: %+v %s", c, p)
	}
	// A single key is used without a label.
	if _, err := s.Update(map[string]string{"only": "sharing: time-slicing\nsharesPerGPU: 3"}, nil); err != nil {
		t.Fatal(err)
	}
	if c, p := s.Current(); c.Sharing != api.SharingTimeSlicing || p != "only" {
		t.Errorf("%+v %s", c, p)
	}
}
