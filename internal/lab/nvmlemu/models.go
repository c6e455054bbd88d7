package nvmlemu

import (
	"fmt"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/uuid"
)

// model is a GPU model an emulated node can be built of.
type model struct {
	config      gpus.Config
	switchLinks int // NVLinks per GPU to NVSwitches; 0 = PCIe only
}

// models by the short names the emulated cluster accepts.
var models = map[string]model{
	"A100-40GB":  {gpus.A100_SXM4_40GB, 12},
	"A100-80GB":  {gpus.A100_SXM4_80GB, 12},
	"A100-PCIE":  {gpus.A100_PCIE_40GB, 0},
	"A30-24GB":   {gpus.A30_PCIE_24GB, 0},
	"H100-80GB":  {gpus.H100_SXM5_80GB, 18},
	"H200-141GB": {gpus.H200_SXM5_141GB, 18},
	"B200-180GB": {gpus.B200_SXM5_180GB, 18},
}

// ModelNames lists the model names NewModel accepts.
func ModelNames() []string {
	out := make([]string, 0, len(models))
	for k := range models {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// NewModel is a mock node of count GPUs of the named model (ModelNames,
// case-insensitive). The GPU UUIDs derive from seed (the node's name), so
// an agent restarted on the same emulated node sees the same GPUs.
func NewModel(name string, count int, seed string) (*Node, error) {
	var m model
	found := false
	for k, v := range models {
		if strings.EqualFold(k, name) {
			m, found = v, true
		}
	}
	if !found {
		return nil, fmt.Errorf("unknown GPU model %q (known: %s)", name, strings.Join(ModelNames(), ", "))
	}
	if count < 1 || count > 16 {
		return nil, fmt.Errorf("%d GPUs per node: want 1 to 16", count)
	}
	s, err := server.New(
		server.WithGPUs(gpus.Multiple(count, m.config)...),
		server.WithDriverVersion("550.54.15"),
		server.WithNVMLVersion("12.550.54.15"),
		server.WithCUDADriverVersion(12040),
	)
	if err != nil {
		return nil, fmt.Errorf("mock NVML for %d x %s: %w", count, name, err)
	}
	for i, d := range s.Devices {
		d.(*server.Device).UUID = "GPU-" + uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "tessera-lab/%s/%d", seed, i)).String()
	}
	return Complete(s, Wiring{SwitchLinks: m.switchLinks, GPUsPerNUMA: (count + 1) / 2}), nil
}
