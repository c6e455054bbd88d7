package config

import (
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// The configurations of NVIDIA's guides, as users write them.
const (
	guideTimeSlicing = `version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
`
	guideMPS = `version: v1
sharing:
  mps:
    renameByDefault: true
    resources:
    - name: nvidia.com/gpu
      replicas: 10
`
	guideMIGParted = `version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.5gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 7
  all-2g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "2g.10gb": 3
  a100-mixed:
    - device-filter: ["0x20B010DE", "0x20B110DE"]
      devices: [0, 1]
      mig-enabled: true
      mig-devices:
        "3g.20gb": 1
        "2g.10gb": 1
        "1g.5gb": 2
    - devices: all
      mig-enabled: false
`
)

func TestGuideConfigs(t *testing.T) {
	c, err := Parse([]byte(guideTimeSlicing), names)
	if err != nil || c.Sharing != api.SharingTimeSlicing || c.SharesPerGPU != 4 || c.RenameShared {
		t.Errorf("time-slicing: %+v %v", c, err)
	}
	c, err = Parse([]byte(guideMPS), names)
	if err != nil || c.Sharing != api.SharingMPS || c.SharesPerGPU != 10 || !c.RenameShared || c.FailRequestsGreaterThanOne {
		t.Errorf("mps: %+v %v", c, err)
	}
	ls, err := ParseMIGParted([]byte(guideMIGParted))
	if err != nil {
		t.Fatal(err)
	}
	if l := ls["all-1g.5gb"]; len(l.Entries) != 1 || l.Entries[0].Counts["1g.5gb"] != 7 || !l.Entries[0].MIGEnabled || l.Entries[0].Devices != nil {
		t.Errorf("all-1g.5gb: %+v", l)
	}
	if l := ls["all-disabled"]; l.EnablesMIG() {
		t.Error("all-disabled enables MIG")
	}
	mixed := ls["a100-mixed"]
	if e, ok := mixed.For(1, 0x20B010DE); !ok || e.Counts["3g.20gb"] != 1 {
		t.Errorf("a100-mixed GPU 1: %+v %v", e, ok)
	}
	if e, ok := mixed.For(0, 0x233010DE); !ok || e.MIGEnabled {
		t.Errorf("a100-mixed on an H100 (filtered out of the first entry): %+v %v", e, ok)
	}
	if e, ok := mixed.For(2, 0x20B010DE); !ok || e.MIGEnabled {
		t.Errorf("a100-mixed GPU 2: %+v %v", e, ok)
	}
}

// TestResolveMIGLayout: the label nvidia.com/mig.config selects a layout
// of a mig-parted document in the ConfigMap, over the profile's migLayout.
func TestResolveMIGLayout(t *testing.T) {
	data := map[string]string{
		"mig-parted":  guideMIGParted,
		"default":     "sharing: mig\nmigLayout: all-2g.10gb\n",
		"nvidia-mig":  "version: v1\nflags:\n  migStrategy: single\n",
		"time-slices": guideTimeSlicing,
	}
	_, c, err := Resolve(data, nil, names)
	if err != nil || c.Layout == nil || c.Layout.Name != "all-2g.10gb" || c.MIGStrategy != api.MIGStrategyMixed {
		t.Fatalf("profile's layout: %+v %v", c, err)
	}
	_, c, err = Resolve(data, map[string]string{api.LabelMIGConfig: "all-1g.5gb"}, names)
	if err != nil || c.Layout.Name != "all-1g.5gb" {
		t.Fatalf("label's layout: %+v %v", c, err)
	}
	_, c, err = Resolve(data, map[string]string{api.LabelMIGConfig: "all-1g.5gb", api.LabelNodeConfig: "nvidia-mig"}, names)
	if err != nil || c.Layout.Name != "all-1g.5gb" || c.MIGStrategy != api.MIGStrategySingle || c.Sharing != api.SharingMIG {
		t.Fatalf("NVIDIA single strategy: %+v %v", c, err)
	}
	_, _, err = Resolve(data, map[string]string{api.LabelMIGConfig: "all-1g.5gb", api.LabelNodeConfig: "time-slices"}, names)
	if err == nil || !strings.Contains(err.Error(), `turns MIG on, but the profile shares GPUs as "time-slicing"`) {
		t.Errorf("MIG layout on a time-slicing profile: %v", err)
	}
	_, c, err = Resolve(data, map[string]string{api.LabelMIGConfig: "all-disabled", api.LabelNodeConfig: "time-slices"}, names)
	if err != nil || c.Layout.Name != "all-disabled" {
		t.Errorf("all-disabled on a time-slicing profile: %+v %v", c, err)
	}
	_, _, err = Resolve(data, map[string]string{api.LabelMIGConfig: "all-3g"}, names)
	if err == nil || !strings.Contains(err.Error(), `node label nvidia.com/mig.config="all-3g" names no MIG layout`) || !strings.Contains(err.Error(), `"all-1g.5gb"`) {
		t.Errorf("unknown layout: %v", err)
	}
	// Only a mig-parted document and the label: a MIG node (mixed).
	_, c, err = Resolve(map[string]string{"config.yaml": guideMIGParted}, map[string]string{api.LabelMIGConfig: "all-1g.5gb"}, names)
	if err != nil || c.Sharing != api.SharingMIG || c.MIGStrategy != api.MIGStrategyMixed || c.Layout.Name != "all-1g.5gb" {
		t.Errorf("mig-parted only: %+v %v", c, err)
	}
}

// TestNVIDIAFields: every field of NVIDIA's config that changes what a
// container gets is implemented or refused naming the field; fields that
// only tune NVIDIA's plugin are accepted and noted.
func TestNVIDIAFields(t *testing.T) {
	refused := []struct{ doc, want string }{
		{"version: v1\nflags:\n  plugin:\n    passDeviceSpecs: true", "flags.plugin.passDeviceSpecs=true is not supported"},
		{"version: v1\nflags:\n  plugin:\n    deviceListStrategy: volume-mounts", "flags.plugin.deviceListStrategy volume-mounts is not supported"},
		{"version: v1\nflags:\n  plugin:\n    deviceListStrategy: [envvar, cdi-annotations]", "flags.plugin.deviceListStrategy [envvar cdi-annotations] is not supported"},
		{"version: v1\nflags:\n  plugin:\n    deviceIDStrategy: index", `flags.plugin.deviceIDStrategy "index" is not supported`},
		{"version: v1\nflags:\n  gdsEnabled: true", "flags.gdsEnabled=true is not supported"},
		{"version: v1\nflags:\n  mofedEnabled: true", "flags.mofedEnabled=true is not supported"},
		{"version: v1\nflags:\n  migStrategy: all", `flags.migStrategy "all" is not one of`},
		{"version: v1\nflags:\n  mpsRoot: relative", `flags.mpsRoot "relative": want an absolute path`},
		{"version: v1\nresources:\n  gpus:\n  - pattern: '*A100*'\n    name: a100", "resources.gpus / resources.mig (renaming resources by GPU model) is not supported"},
		{"version: v1\nimex:\n  channelIDs: [0]", "imex.channelIDs / imex.required is not supported"},
		{"version: v1\nflags:\n  unknownFlag: 1", `unknown field "unknownFlag"`},
		{"version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 49", "replicas 49 exceed the 48 clients MPS serves per GPU"},
		{"version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n      rename: gpu-mps", `sharing.mps.resources[0].rename "gpu-mps": only "nvidia.com/gpu.shared"`},
		{"version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/mig-1g.5gb\n      replicas: 2", `sharing.mps.resources[0].name "nvidia.com/mig-1g.5gb": sharing MIG devices is not supported`},
		{"version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n      devices: [0, 1]", "sharing.mps.resources[0].devices [0 1]: only \"all\""},
		{"version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2", `sharing.mps with flags.migStrategy "mixed": MPS on MIG devices is not supported`},
		{"version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2", "sharing.timeSlicing and sharing.mps are both set"},
		{"version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n    - name: nvidia.com/gpu\n      replicas: 3", `sharing.timeSlicing.resources[1]: "nvidia.com/gpu" listed twice`},
	}
	for _, tt := range refused {
		_, err := Parse([]byte(tt.doc), names)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%q) = %v, want %q", tt.doc, err, tt.want)
		}
	}
	// Implemented: failRequestsGreaterThanOne, rename to .shared, mpsRoot.
	c, err := Parse([]byte("version: v1\nflags:\n  mpsRoot: /run/nvidia/mps\nsharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n    resources:\n    - name: nvidia.com/gpu\n      rename: nvidia.com/gpu.shared\n      replicas: 3\n"), names)
	if err != nil || !c.FailRequestsGreaterThanOne || !c.RenameShared || c.MPSRoot != "/run/nvidia/mps" || c.SharesPerGPU != 3 {
		t.Errorf("implemented fields: %+v %v", c, err)
	}
	// Logged: plugin-only tuning, and the default values of the refused
	// fields (which are Tessera's behaviour).
	doc := `version: v1
flags:
  migStrategy: none
  failOnInitError: true
  nvidiaDriverRoot: /run/nvidia/driver
  useNodeFeatureAPI: false
  gdsEnabled: false
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: envvar
    deviceIDStrategy: uuid
    containerDriverRoot: /driver-root
  gfd:
    oneshot: false
    sleepInterval: 60s
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
`
	c, err = Parse([]byte(doc), names)
	if err != nil || c.Sharing != api.SharingTimeSlicing {
		t.Fatalf("%+v %v", c, err)
	}
	notes := strings.Join(c.Notes, "\n")
	for _, f := range []string{"flags.failOnInitError=true", "flags.nvidiaDriverRoot=/run/nvidia/driver", "flags.useNodeFeatureAPI=false", "flags.plugin.containerDriverRoot=/driver-root", "flags.gfd=oneshot,sleepInterval"} {
		if !strings.Contains(notes, f) {
			t.Errorf("notes do not mention %s:\n%s", f, notes)
		}
	}
	// A static MIG node in NVIDIA's terms: a MIG strategy, no sharing.
	c, err = Parse([]byte("version: v1\nflags:\n  migStrategy: mixed\n"), names)
	if err != nil || c.Sharing != api.SharingMIG || c.MIGStrategy != api.MIGStrategyMixed {
		t.Errorf("migStrategy mixed: %+v %v", c, err)
	}
}

func TestMIGPartedErrors(t *testing.T) {
	for _, tt := range []struct{ doc, want string }{
		{"version: v2\nmig-configs:\n  a:\n  - devices: all\n    mig-enabled: false", `version "v2" is not supported`},
		{"version: v1\nmig-configs:\n  a:\n  - devices: some\n    mig-enabled: false", `mig-configs.a[0].devices "some"`},
		{"version: v1\nmig-configs:\n  a:\n  - devices: [0, -1]\n    mig-enabled: false", "mig-configs.a[0].devices: -1 is not a GPU index"},
		{"version: v1\nmig-configs:\n  a:\n  - mig-enabled: false", "mig-configs.a[0].devices is missing"},
		{"version: v1\nmig-configs:\n  a:\n  - devices: all\n    device-filter: 20B0\n    mig-enabled: false", `mig-configs.a[0].device-filter "20B0"`},
		{"version: v1\nmig-configs:\n  a:\n  - devices: all\n    mig-enabled: true\n    mig-devices: {1c.3g.20gb: 1}", "compute instance"},
		{"version: v1\nmig-configs:\n  a:\n  - devices: all\n    mig-enabled: true\n    mig-devices: {1g.5gb: 9}", "mig-configs.a[0].mig-devices[1g.5gb]: 9 outside [0, 8]"},
		{"version: v1\nmig-configs:\n  a:\n  - devices: all\n    mig-enabled: false\n    mig-devices: {1g.5gb: 1}", "mig-devices set with mig-enabled false"},
		{"version: v1\nmig-configs:\n  a:\n  - devices: all\n    mig-enabled: true\n    compute-instances: 1", `unknown field "compute-instances"`},
	} {
		_, err := ParseMIGParted([]byte(tt.doc))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseMIGParted(%q) = %v, want %q", tt.doc, err, tt.want)
		}
	}
	if _, err := Parse([]byte(guideMIGParted), names); err == nil || !strings.Contains(err.Error(), "is a MIG layout, not a node profile") {
		t.Errorf("mig-parted as a profile: %v", err)
	}
}
