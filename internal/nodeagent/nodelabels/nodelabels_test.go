package nodelabels

import (
	"reflect"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/api"
)

func TestFor(t *testing.T) {
	inv := &api.NodeInventory{GPUs: []api.GPU{
		{Index: 1, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, ComputeCapability: "9.0", MIG: api.MIG{Capable: true}, Sharing: api.SharingMPS},
		{Index: 0, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, ComputeCapability: "9.0", MIG: api.MIG{Capable: true}, Sharing: api.SharingMPS},
	}}
	got := For(inv, Driver{Version: "550.54.15", CUDA: 12040})
	want := map[string]string{
		Product: "NVIDIA-H100-80GB-HBM3", Memory: "81559", Count: "2", Family: "hopper",
		ComputeMajor: "9", ComputeMinor: "0", DriverMajor: "550", DriverMinor: "54", DriverRev: "15",
		RuntimeMajor: "12", RuntimeMinor: "4", MIGCapable: "true", Sharing: "mps", SharingStrategy: "mps",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("For:\n got %v\nwant %v", got, want)
	}
	if l := For(&api.NodeInventory{}, Driver{Version: "1.2"}); len(l) != 0 {
		t.Errorf("a node without GPUs has labels %v", l)
	}
	// Unknown driver fields are left out (Patch then removes them).
	l := For(inv, Driver{})
	for _, k := range []string{DriverMajor, RuntimeMajor} {
		if _, ok := l[k]; ok {
			t.Errorf("%s set without a driver version", k)
		}
	}
}

func TestFamily(t *testing.T) {
	for cc, want := range map[string]string{"7.0": "volta", "7.5": "turing", "8.0": "ampere", "8.6": "ampere", "8.9": "ada-lovelace", "9.0": "hopper", "10.0": "blackwell", "3.5": ""} {
		inv := &api.NodeInventory{GPUs: []api.GPU{{Model: "x", ComputeCapability: cc}}}
		if got := For(inv, Driver{})[Family]; got != want {
			t.Errorf("compute %s: family %q, want %q", cc, got, want)
		}
	}
}

func TestSanitize(t *testing.T) {
	for in, want := range map[string]string{
		"NVIDIA A100-SXM4-40GB":      "NVIDIA-A100-SXM4-40GB",
		" Tesla V100 (PCIe) 16GB ":   "Tesla-V100-PCIe-16GB",
		"a/b:c":                      "abc",
		string(make([]byte, 0)) + "": "",
	} {
		if got := Sanitize(in); got != want {
			t.Errorf("Sanitize(%q) = %q, want %q", in, got, want)
		}
	}
	long := ""
	for i := 0; i < 80; i++ {
		long += "x"
	}
	if got := Sanitize(long); len(got) != 63 {
		t.Errorf("Sanitize of 80 characters has %d", len(got))
	}
}

func TestPatch(t *testing.T) {
	cur := map[string]string{Product: "old", Family: "ampere", "other": "kept", DriverMajor: "535"}
	want := map[string]string{Product: "new", Family: "ampere"}
	got := Patch(cur, want)
	exp := map[string]any{Product: "new", DriverMajor: nil}
	if !reflect.DeepEqual(got, exp) {
		t.Errorf("Patch = %v, want %v", got, exp)
	}
	if p := Patch(want, want); p != nil {
		t.Errorf("Patch of equal labels = %v, want nil", p)
	}
}
