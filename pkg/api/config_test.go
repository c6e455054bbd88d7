package api

import (
	"math"
	"testing"
)

func TestClusterConfigDefaults(t *testing.T) {
	var c ClusterConfig
	c.Defaults()
	want := ClusterConfig{ResourcePrefix: "nvidia.com", NodePolicy: NodeBinpack, GPUPolicy: GPUBinpack, PlacementPolicy: "tessera"}
	if c != want {
		t.Errorf("got %+v, want %+v", c, want)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	set := ClusterConfig{ResourcePrefix: "tessera.io", NodePolicy: NodeSpread, GPUPolicy: GPUTopologyAware, PlacementPolicy: "fgd"}
	c = set
	c.Defaults()
	if c != set {
		t.Errorf("Defaults overwrote set fields: %+v", c)
	}
	// An unset placement policy is the node policy's.
	c = ClusterConfig{NodePolicy: NodeSpread}
	c.Defaults()
	if c.PlacementPolicy != string(NodeSpread) {
		t.Errorf("placementPolicy %q with nodePolicy spread, want spread", c.PlacementPolicy)
	}
}

func TestClusterConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *ClusterConfig)
		want   string
	}{
		{"prefix", func(c *ClusterConfig) { c.ResourcePrefix = "Tessera" }, `resourcePrefix: resource prefix "Tessera": label "Tessera" contains 'T' (only lowercase letters, digits and '-' are allowed)`},
		{"node policy", func(c *ClusterConfig) { c.NodePolicy = "topology-aware" }, `nodePolicy "topology-aware" is not one of "binpack" or "spread"`},
		{"GPU policy", func(c *ClusterConfig) { c.GPUPolicy = "random" }, `gpuPolicy "random" is not one of "binpack", "spread" or "topology-aware"`},
		{"placement policy", func(c *ClusterConfig) { c.PlacementPolicy = "FGD" }, `placementPolicy "FGD" is not a policy name (lowercase letters, digits and '-', at most 63)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c ClusterConfig
			c.Defaults()
			tt.mutate(&c)
			if err := c.Validate(); err == nil || err.Error() != tt.want {
				t.Errorf("error\n got %v\nwant %s", err, tt.want)
			}
		})
	}
}

func TestNodeConfigDefaults(t *testing.T) {
	var c NodeConfig
	c.Defaults()
	if c.SharesPerGPU != 10 || c.MemoryOvercommit != 1 || c.Sharing != SharingShared || c.ExcludeGPUs != nil {
		t.Errorf("got %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c = NodeConfig{Sharing: SharingExclusive}
	c.Defaults()
	if c.SharesPerGPU != 1 {
		t.Errorf("exclusive default shares = %d, want 1", c.SharesPerGPU)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c = NodeConfig{SharesPerGPU: 4, MemoryOvercommit: 1.5, Sharing: SharingTimeSlicing, ExcludeGPUs: []string{"3", "GPU-abc"}}
	c.Defaults()
	if c.SharesPerGPU != 4 || c.MemoryOvercommit != 1.5 || c.Sharing != SharingTimeSlicing {
		t.Errorf("Defaults overwrote set fields: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestNodeConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *NodeConfig)
		want   string
	}{
		{"sharing", func(c *NodeConfig) { c.Sharing = "vgpu" }, `sharing "vgpu" is not one of "shared", "exclusive", "time-slicing", "mps", "mig" or "mig-dynamic"`},
		{"mig without strategy", func(c *NodeConfig) { c.Sharing = SharingMIG }, `migStrategy "none" with mig sharing: MIG devices need the "single" or "mixed" strategy`},
		{"strategy without mig", func(c *NodeConfig) { c.MIGStrategy = MIGStrategySingle }, `migStrategy "single" with shared sharing: a MIG strategy needs sharing "mig"`},
		{"bad strategy", func(c *NodeConfig) { c.MIGStrategy = "both" }, `migStrategy "both" is not one of "none", "single" or "mixed"`},
		{"layout without mig", func(c *NodeConfig) { c.MIGLayout = "all-1g.5gb" }, `migLayout "all-1g.5gb" with shared sharing: a MIG layout needs sharing "mig"`},
		{"mps clients", func(c *NodeConfig) { c.Sharing, c.SharesPerGPU = SharingMPS, 49 }, `sharesPerGPU 49 with mps sharing exceeds the 48 clients MPS serves per GPU`},
		{"rename shared", func(c *NodeConfig) { c.RenameShared = true }, `renameShared or failRequestsGreaterThanOne with shared sharing: they apply to "time-slicing" and "mps" only`},
		{"shares low", func(c *NodeConfig) { c.SharesPerGPU = -1 }, `sharesPerGPU -1 outside [1, 128]`},
		{"shares high", func(c *NodeConfig) { c.SharesPerGPU = 129 }, `sharesPerGPU 129 outside [1, 128]`},
		{"exclusive shares", func(c *NodeConfig) { c.Sharing = SharingExclusive }, `sharesPerGPU 10 with exclusive sharing (must be 1)`},
		{"overcommit low", func(c *NodeConfig) { c.MemoryOvercommit = 0.9 }, `memoryOvercommit 0.9 outside [1, 4]`},
		{"overcommit NaN", func(c *NodeConfig) { c.MemoryOvercommit = math.NaN() }, `memoryOvercommit NaN outside [1, 4]`},
		{"exclude index", func(c *NodeConfig) { c.ExcludeGPUs = []string{"64"} }, `excludeGPUs[0]: index 64 outside [0, 63]`},
		{"exclude negative", func(c *NodeConfig) { c.ExcludeGPUs = []string{"-1"} }, `excludeGPUs[0]: index -1 outside [0, 63]`},
		{"exclude empty", func(c *NodeConfig) { c.ExcludeGPUs = []string{"0", ""} }, `excludeGPUs[1]: uuid is empty`},
		{"exclude twice", func(c *NodeConfig) { c.ExcludeGPUs = []string{"GPU-a", "GPU-a"} }, `excludeGPUs[1]: "GPU-a" listed twice`},
		{"mode", func(c *NodeConfig) { c.Mode = "cdi" }, `mode "cdi" is not one of "device-plugin", "dra" or "volcano"`},
		{"dra time-slicing", func(c *NodeConfig) { c.Mode, c.Sharing = ModeDRA, SharingTimeSlicing },
			`sharing "time-slicing" with mode "dra": a DRA node shares GPUs by capacity ("shared") or gives them whole ("exclusive"); time-slicing is served by the device plugin (mode "device-plugin")`},
		{"dra mig", func(c *NodeConfig) { c.Mode, c.Sharing, c.MIGStrategy = ModeDRA, SharingMIG, MIGStrategyMixed },
			`sharing "mig" with mode "dra": a DRA node shares GPUs by capacity ("shared") or gives them whole ("exclusive"); mig is served by the device plugin (mode "device-plugin")`},
		{"dra overcommit", func(c *NodeConfig) { c.Mode, c.MemoryOvercommit = ModeDRA, 2 }, `memoryOvercommit 2 with mode "dra": DRA capacities are the GPUs' physical memory (must be 1)`},
		{"volcano exclusive", func(c *NodeConfig) { c.Mode, c.Sharing, c.SharesPerGPU = ModeVolcano, SharingExclusive, 1 },
			`sharing "exclusive" with mode "volcano": a volcano node shares its GPUs through the limiter ("shared", Volcano's hami-core mode) or by MIG instances made for each pod ("mig-dynamic", Volcano's mig mode)`},
		{"volcano static mig", func(c *NodeConfig) { c.Mode, c.Sharing, c.MIGStrategy = ModeVolcano, SharingMIG, MIGStrategyMixed },
			`sharing "mig" with mode "volcano": a volcano node shares its GPUs through the limiter ("shared", Volcano's hami-core mode) or by MIG instances made for each pod ("mig-dynamic", Volcano's mig mode)`},
		{"volcano overcommit", func(c *NodeConfig) { c.Mode, c.MemoryOvercommit = ModeVolcano, 2 },
			`memoryOvercommit 2 with mode "volcano": the GPUs are registered with Volcano at their physical memory (must be 1)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c NodeConfig
			c.Defaults()
			tt.mutate(&c)
			if err := c.Validate(); err == nil || err.Error() != tt.want {
				t.Errorf("error\n got %v\nwant %s", err, tt.want)
			}
		})
	}
}

func TestNodeConfigMIGDefaults(t *testing.T) {
	c := NodeConfig{Sharing: SharingMIG}
	c.Defaults()
	if c.MIGStrategy != MIGStrategyMixed {
		t.Errorf("mig sharing defaults to strategy %q, want mixed", c.MIGStrategy)
	}
	if err := c.Validate(); err != nil {
		t.Error(err)
	}
	for _, m := range []SharingMode{SharingMPS, SharingMIGDynamic, SharingTimeSlicing} {
		c := NodeConfig{Sharing: m, RenameShared: m != SharingMIGDynamic}
		c.Defaults()
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", m, err)
		}
		if c.MIGStrategy != MIGStrategyNone {
			t.Errorf("%s: strategy %q", m, c.MIGStrategy)
		}
	}
}

func TestNodeConfigDRA(t *testing.T) {
	for _, sh := range []SharingMode{SharingShared, SharingExclusive} {
		c := NodeConfig{Mode: ModeDRA, Sharing: sh}
		c.Defaults()
		if err := c.Validate(); err != nil {
			t.Errorf("mode dra, sharing %s: %v", sh, err)
		}
	}
}
