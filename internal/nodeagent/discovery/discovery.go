// Package discovery reads the node's GPUs and the links between them from
// NVML. It only reads: health, sharing and configuration are applied by the
// callers. NVML is an interface so that tests run on go-nvml's mock servers.
package discovery

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/internal/mig"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Device is one GPU as NVML reports it, with the handle the health monitor
// registers events on.
type Device struct {
	// GPU has every hardware field filled in; Health is Healthy and the
	// sharing fields are left for the caller.
	GPU    api.GPU
	Handle nvml.Device
	// PCIDeviceID is NVML's PCI device ID (device << 16 | vendor, e.g.
	// 0x20B010DE), what mig-parted's device-filter matches.
	PCIDeviceID uint32
	// MIG is the model's MIG geometry (nil: not MIG capable, or a model
	// Tessera has no table for) and MIGDevices the MIG devices found.
	MIG        *mig.Model
	MIGDevices []MIGDevice
	// MIGPending reports a MIG mode change waiting for a GPU reset.
	MIGPending bool
}

// Result is what Discover found.
type Result struct {
	Devices []Device
	// Skipped lists GPUs NVML counts but that could not be read (for
	// example a GPU that fell off the bus before the agent started).
	Skipped []error
}

// Options tune discovery.
type Options struct {
	// SysfsRoot is where the PCI devices are found when NVML does not
	// report a NUMA node ("/sys" when empty).
	SysfsRoot string
}

// Discover lists the GPUs of lib, which must be initialised. Only a failure
// to count the GPUs is an error; a GPU that cannot be read is reported in
// Result.Skipped and left out.
func Discover(lib nvml.Interface, opts Options) (*Result, error) {
	if opts.SysfsRoot == "" {
		opts.SysfsRoot = "/sys"
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml DeviceGetCount: %v", ret)
	}
	if n > api.MaxGPUsPerNode {
		return nil, fmt.Errorf("NVML reports %d GPUs, more than the limit of %d per node", n, api.MaxGPUsPerNode)
	}
	res := &Result{}
	for i := 0; i < n; i++ {
		h, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			res.Skipped = append(res.Skipped, fmt.Errorf("GPU %d: DeviceGetHandleByIndex: %v", i, ret))
			continue
		}
		g, err := readGPU(h, i, opts)
		if err != nil {
			res.Skipped = append(res.Skipped, fmt.Errorf("GPU %d: %w", i, err))
			continue
		}
		d := Device{GPU: g, Handle: h}
		if pci, ret := h.GetPciInfo(); ret == nvml.SUCCESS {
			d.PCIDeviceID = pci.PciDeviceId
		}
		if g.MIG.Capable {
			if m, ok := mig.ModelFor(g.Model, g.MemoryMiB); ok {
				d.MIG = m
			}
			if err := d.RefreshMIG(); err != nil {
				res.Skipped = append(res.Skipped, fmt.Errorf("GPU %d (%s): MIG devices: %w", i, g.UUID, err))
			}
		}
		res.Devices = append(res.Devices, d)
	}
	links(res.Devices)
	return res, nil
}

// readGPU reads one GPU. UUID, name and memory are required; everything
// else degrades to "unknown" when the driver does not support the query.
func readGPU(h nvml.Device, pos int, opts Options) (api.GPU, error) {
	g := api.GPU{Index: pos, NUMANode: -1, Health: api.Healthy}
	var ret nvml.Return
	if g.UUID, ret = h.GetUUID(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("GetUUID: %v", ret)
	}
	if g.Model, ret = h.GetName(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("%s: GetName: %v", g.UUID, ret)
	}
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("%s: GetMemoryInfo: %v", g.UUID, ret)
	}
	g.MemoryMiB = int64(mem.Total >> 20)
	if idx, ret := h.GetIndex(); ret == nvml.SUCCESS {
		g.Index = idx
	}
	if major, minor, ret := h.GetCudaComputeCapability(); ret == nvml.SUCCESS {
		g.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	}
	if pci, ret := h.GetPciInfo(); ret == nvml.SUCCESS {
		g.PCIBusID = NormalizeBusID(cString(pci.BusId[:]))
	}
	if numa, ret := h.GetNumaNodeId(); ret == nvml.SUCCESS {
		g.NUMANode = numa
	} else if g.PCIBusID != "" {
		g.NUMANode = sysfsNUMANode(opts.SysfsRoot, g.PCIBusID)
	}
	if cur, _, ret := h.GetMigMode(); ret == nvml.SUCCESS {
		g.MIG = api.MIG{Capable: true, Enabled: cur == nvml.DEVICE_MIG_ENABLE}
	}
	g.SMCount = smCount(h, g.Model)
	return g, nil
}

// RefreshMIG re-reads the GPU's MIG mode and MIG devices (they change
// when layouts are applied and, in dynamic mode, per pod).
func (d *Device) RefreshMIG() error {
	if !d.GPU.MIG.Capable {
		return nil
	}
	enabled, pending, devs, mib, err := ReadMIG(d.Handle, d.MIG)
	d.GPU.MIG.Enabled, d.MIGPending = enabled, pending
	d.MIGDevices = devs
	d.GPU.MIG.Devices = nil
	for _, m := range devs {
		d.GPU.MIG.Devices = append(d.GPU.MIG.Devices, m.MIGDevice)
	}
	d.GPU.MIG.ProfileMemoryMiB = nil
	if enabled && len(mib) > 0 {
		d.GPU.MIG.ProfileMemoryMiB = mib
	}
	return err
}

// smCount asks NVML for the multiprocessor count (nvmlDeviceGetAttributes;
// many drivers answer it only for MIG devices) and otherwise falls back to
// the published count of well-known models; 0 means unknown.
func smCount(h nvml.Device, model string) int {
	if attr, ret := h.GetAttributes(); ret == nvml.SUCCESS && attr.MultiprocessorCount > 0 {
		return int(attr.MultiprocessorCount)
	}
	return KnownSMCount(model)
}

// knownSMs are the SM counts of full (non-MIG) GPUs from NVIDIA's data
// sheets, matched as model selectors (api.ModelMatches), most specific
// first.
var knownSMs = []struct {
	selector string
	sms      int
}{
	{"H100 PCIe", 114},
	{"H100 NVL", 132},
	{"H100", 132},
	{"H200", 132},
	{"H20", 78},
	{"A100", 108},
	{"A800", 108},
	{"A30", 56},
	{"A10", 72},
	{"L40S", 142},
	{"L40", 142},
	{"L4", 58},
	{"T4", 40},
	{"V100", 80},
}

// KnownSMCount returns the SM count of a well-known GPU model, or 0.
func KnownSMCount(model string) int {
	for _, k := range knownSMs {
		if api.ModelMatches(k.selector, model) {
			return k.sms
		}
	}
	return 0
}

// NormalizeBusID writes a PCI address as NVML does: an 8-digit domain and
// upper-case hex ("00000000:07:00.0"), so addresses from NVML, its mocks
// and sysfs compare equal.
func NormalizeBusID(id string) string {
	id = strings.ToUpper(strings.TrimSpace(id))
	dom, rest, ok := strings.Cut(id, ":")
	if !ok || strings.Count(rest, ":") != 1 {
		return id
	}
	if len(dom) < 8 {
		dom = strings.Repeat("0", 8-len(dom)) + dom
	}
	return dom + ":" + rest
}

// sysfsNUMANode reads /sys/bus/pci/devices/<addr>/numa_node (4-digit
// domain, lower case); -1 when unknown.
func sysfsNUMANode(root, busID string) int {
	dom, rest, _ := strings.Cut(strings.ToLower(busID), ":")
	if len(dom) > 4 {
		dom = dom[len(dom)-4:]
	}
	b, err := os.ReadFile(filepath.Join(root, "bus", "pci", "devices", dom+":"+rest, "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < -1 {
		return -1
	}
	return n
}

func cString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

// links fills GPU.Links for every pair: NVLink when the pair shares links
// (directly, or through NVSwitches, where every GPU reaches every other
// with all its switch links), otherwise the PCIe level of their common
// ancestor. A pair NVML cannot place gets no link (unknown).
func links(devs []Device) {
	byBus := make(map[string]int, len(devs))
	for i, d := range devs {
		if d.GPU.PCIBusID != "" {
			byBus[d.GPU.PCIBusID] = i
		}
	}
	direct := make([]map[int]int, len(devs))
	switched := make([]int, len(devs))
	for i, d := range devs {
		direct[i] = map[int]int{}
		for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
			st, ret := d.Handle.GetNvLinkState(l)
			if ret == nvml.ERROR_NOT_SUPPORTED && l == 0 {
				break // no NVLink on this GPU
			}
			if ret != nvml.SUCCESS || st != nvml.FEATURE_ENABLED {
				continue
			}
			remote, ret := d.Handle.GetNvLinkRemotePciInfo(l)
			if ret != nvml.SUCCESS {
				continue
			}
			if j, ok := byBus[NormalizeBusID(cString(remote.BusId[:]))]; ok && j != i {
				direct[i][j]++
			} else {
				switched[i]++ // an NVSwitch (or a device that is not one of our GPUs)
			}
		}
	}
	for i := range devs {
		devs[i].GPU.Links = nil
		for j := range devs {
			if i == j {
				continue
			}
			n := max(direct[i][j], direct[j][i])
			if switched[i] > 0 && switched[j] > 0 {
				n += min(switched[i], switched[j])
			}
			if n > 0 {
				devs[i].GPU.Links = append(devs[i].GPU.Links, api.Link{PeerUUID: devs[j].GPU.UUID, Type: api.LinkNVLink, NVLinks: min(n, api.MaxNVLinks)})
				continue
			}
			lvl, ret := devs[i].Handle.GetTopologyCommonAncestor(devs[j].Handle)
			if ret != nvml.SUCCESS {
				continue
			}
			if t, ok := pcieLevel(lvl); ok {
				devs[i].GPU.Links = append(devs[i].GPU.Links, api.Link{PeerUUID: devs[j].GPU.UUID, Type: t})
			}
		}
	}
}

// pcieLevel maps NVML's topology level to a link type. TOPOLOGY_INTERNAL
// (two GPUs of one board) is the closest PCIe relation.
func pcieLevel(l nvml.GpuTopologyLevel) (api.LinkType, bool) {
	switch l {
	case nvml.TOPOLOGY_INTERNAL, nvml.TOPOLOGY_SINGLE:
		return api.LinkPCIeSingle, true
	case nvml.TOPOLOGY_MULTIPLE:
		return api.LinkPCIeMultiple, true
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return api.LinkPCIeHostBridge, true
	case nvml.TOPOLOGY_NODE:
		return api.LinkPCIeNUMA, true
	case nvml.TOPOLOGY_SYSTEM:
		return api.LinkSystem, true
	}
	return "", false
}

// ErrNoLibrary is returned by Open when the NVML library is not installed.
var ErrNoLibrary = errors.New("NVML library (libnvidia-ml.so.1) not found: is the NVIDIA driver installed and mounted into the agent?")

// Open loads and initialises NVML: the library at libraryPath, or, when
// it is empty, libnvidia-ml.so.1 from the dynamic loader's search path
// (where NVIDIA's container runtime mounts it). The library is loaded at
// run time, so the binary runs (and reports this error) on machines
// without a GPU.
func Open(libraryPath string) (nvml.Interface, error) {
	var opts []nvml.LibraryOption
	if libraryPath != "" {
		opts = append(opts, nvml.WithLibraryPath(libraryPath))
	}
	lib := nvml.New(opts...)
	ret := lib.Init()
	if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
		if libraryPath != "" {
			return nil, fmt.Errorf("NVML library %s could not be loaded (its dependencies missing, or built for another architecture?)", libraryPath)
		}
		return nil, ErrNoLibrary
	}
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml Init: %v", ret)
	}
	return lib, nil
}
