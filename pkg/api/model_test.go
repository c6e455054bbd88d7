package api

import "testing"

func TestModelMatches(t *testing.T) {
	tests := []struct {
		selector, model string
		want            bool
	}{
		{"A100", "NVIDIA A100-SXM4-40GB", true},
		{"a100", "NVIDIA A100-SXM4-40GB", true},
		{"A10", "NVIDIA A100-SXM4-40GB", false},
		{"A10", "NVIDIA A10", true},
		{"nvidia a10", "NVIDIA A10", true},
		{"A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", true},
		{"SXM4", "NVIDIA A100-SXM4-40GB", true},
		{"40GB", "NVIDIA A100-SXM4-80GB", false},
		{" A100 ", "NVIDIA A100-SXM4-40GB", true},
		{"V100M16", "V100M16", true},
		{"V100M16", "V100M32", false},
		{"V100", "V100M16", false},
		{"H100", "NVIDIA H100 80GB HBM3", true},
		{"", "NVIDIA A10", false},
		{"  ", "NVIDIA A10", false},
		{"", "", false},
		{"A10", "", false},
		// Only ASCII case is folded: the Kelvin sign is not "K", whether it
		// is the whole model or a word of it.
		{"K80", "\u212a80", false},
		{"K80", "NVIDIA \u212a80", false},
		{"Tesla K80", "tesla k80", true},
	}
	for _, tt := range tests {
		if got := ModelMatches(tt.selector, tt.model); got != tt.want {
			t.Errorf("ModelMatches(%q, %q) = %v, want %v", tt.selector, tt.model, got, tt.want)
		}
	}
}
