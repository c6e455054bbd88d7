package api

import (
	"reflect"
	"strings"
	"testing"
)

func TestDefaultResourceNames(t *testing.T) {
	want := ResourceNames{
		Prefix:           "nvidia.com",
		GPU:              "nvidia.com/gpu",
		Memory:           "nvidia.com/gpumem",
		MemoryPercentage: "nvidia.com/gpumem-percentage",
		Cores:            "nvidia.com/gpucores",
		MemoryCeiling:    "nvidia.com/gpumem-ceiling",
	}
	if DefaultResourceNames != want {
		t.Errorf("got %+v, want %+v", DefaultResourceNames, want)
	}
	if got := DefaultResourceNames.All(); !reflect.DeepEqual(got, []string{want.GPU, want.Memory, want.MemoryPercentage, want.Cores, want.MemoryCeiling}) {
		t.Errorf("All() = %v", got)
	}
	if got := DefaultResourceNames.PseudoResources(); !reflect.DeepEqual(got, []string{want.Memory, want.MemoryPercentage, want.Cores, want.MemoryCeiling}) {
		t.Errorf("PseudoResources() = %v", got)
	}
}

func TestCustomPrefix(t *testing.T) {
	n, err := NewResourceNames("tessera.io")
	if err != nil {
		t.Fatal(err)
	}
	if n.GPU != "tessera.io/gpu" || n.Memory != "tessera.io/gpumem" || n.MemoryPercentage != "tessera.io/gpumem-percentage" || n.Cores != "tessera.io/gpucores" || n.MemoryCeiling != "tessera.io/gpumem-ceiling" {
		t.Errorf("got %+v", n)
	}
	for _, r := range n.All() {
		if !n.IsGPUResource(r) {
			t.Errorf("IsGPUResource(%q) = false", r)
		}
	}
	for _, r := range []string{"", "nvidia.com/gpu", "tessera.io/gpus", "tessera.io/", "cpu"} {
		if n.IsGPUResource(r) {
			t.Errorf("IsGPUResource(%q) = true", r)
		}
	}
}

func TestNewResourceNamesRejects(t *testing.T) {
	tests := []struct{ prefix, want string }{
		{"", `resource prefix "": must not be empty`},
		{"Tessera.io", `resource prefix "Tessera.io": label "Tessera" contains 'T' (only lowercase letters, digits and '-' are allowed)`},
		{"tessera.io/x", `resource prefix "tessera.io/x": label "io/x" contains '/' (only lowercase letters, digits and '-' are allowed)`},
		{"tessera..io", `resource prefix "tessera..io": empty label (a DNS-1123 subdomain has no leading, trailing or double dots)`},
		{".io", `resource prefix ".io": empty label (a DNS-1123 subdomain has no leading, trailing or double dots)`},
		{"-a.io", `resource prefix "-a.io": label "-a" must start and end with a lowercase letter or digit`},
		{"a-.io", `resource prefix "a-.io": label "a-" must start and end with a lowercase letter or digit`},
		{"é.io", `resource prefix "é.io": label "é" contains 'é' (only lowercase letters, digits and '-' are allowed)`},
		{strings.Repeat("a", 64) + ".io", `resource prefix "` + strings.Repeat("a", 64) + `.io": label "` + strings.Repeat("a", 64) + `" is 64 characters, more than 63`},
		{strings.Repeat("a.", 127), `resource prefix "` + strings.Repeat("a.", 127) + `": length 254 exceeds 253 characters`},
	}
	for _, tt := range tests {
		_, err := NewResourceNames(tt.prefix)
		if err == nil || err.Error() != tt.want {
			t.Errorf("NewResourceNames(%q) error\n got %v\nwant %s", tt.prefix, err, tt.want)
		}
	}
	for _, ok := range []string{"a", "nvidia.com", "gpu-1.example.org", strings.Repeat("a", 63), strings.Repeat("a.", 126) + "a"} {
		if _, err := NewResourceNames(ok); err != nil {
			t.Errorf("NewResourceNames(%q): %v", ok, err)
		}
	}
}

func TestMustResourceNamesPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("MustResourceNames(\"Bad\") did not panic")
		}
	}()
	MustResourceNames("Bad")
}

func TestCountResources(t *testing.T) {
	n := DefaultResourceNames
	for name, want := range map[string]bool{
		"nvidia.com/gpu":             true,
		"nvidia.com/gpu.shared":      true,
		"nvidia.com/mig-1g.5gb":      true,
		"nvidia.com/mig-1g.5gb.me":   true,
		"nvidia.com/mig-3g.20gb+me":  false, // not a Kubernetes resource name
		"nvidia.com/mig-1c.3g.20gb":  false,
		"nvidia.com/mig-":            false,
		"nvidia.com/gpumem":          false,
		"nvidia.com/gpu.shared.more": false,
		"tessera.io/mig-1g.5gb":      false,
	} {
		if got := n.IsCountResource(name); got != want {
			t.Errorf("IsCountResource(%q) = %v, want %v", name, got, want)
		}
		if got := n.IsGPUResource(name); got != (want || name == "nvidia.com/gpumem") {
			t.Errorf("IsGPUResource(%q) = %v", name, got)
		}
	}
	if got := n.MIG("1g.5gb+me"); got != "nvidia.com/mig-1g.5gb.me" {
		t.Errorf("MIG(1g.5gb+me) = %q", got)
	}
	if p, ok := n.MIGProfileOf("nvidia.com/mig-1g.5gb.me"); !ok || p != "1g.5gb+me" {
		t.Errorf("MIGProfileOf(mig-1g.5gb.me) = %q %v", p, ok)
	}
	if got := n.Shared(n.GPU); got != "nvidia.com/gpu.shared" {
		t.Errorf("Shared = %q", got)
	}
}
