package discovery

import (
	"fmt"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/internal/mig"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// MIGDevice is one MIG device as NVML reports it, with the handles the
// node agent needs to destroy it.
type MIGDevice struct {
	api.MIGDevice
	// GPUInstanceID is NVML's ID of its GPU instance on the parent.
	GPUInstanceID int
	Handle        nvml.Device
}

// ReadMIG reads the MIG state of GPU h: whether MIG mode is on and
// pending, the MIG devices that exist (GPU instances with a compute
// instance), sorted by placement, and the memory of each GPU-instance
// profile of the model (profile name → MiB, from NVML). model is nil for
// a GPU whose MIG geometry Tessera does not know; its devices are still
// listed, named from NVML's profile info when it can be read.
func ReadMIG(h nvml.Device, model *mig.Model) (enabled, pending bool, devs []MIGDevice, profileMiB map[string]int64, err error) {
	cur, pend, ret := h.GetMigMode()
	if ret != nvml.SUCCESS {
		return false, false, nil, nil, nil
	}
	enabled, pending = cur == nvml.DEVICE_MIG_ENABLE, pend != cur
	if !enabled {
		return enabled, pending, nil, nil, nil
	}
	names := map[uint32]string{}
	profileMiB = map[string]int64{}
	if model != nil {
		for _, p := range model.Profiles {
			info, ret := h.GetGpuInstanceProfileInfo(p.NVMLProfile)
			if ret != nvml.SUCCESS {
				continue
			}
			names[info.Id] = p.Name
			profileMiB[p.Name] = int64(info.MemorySizeMB)
		}
	}
	max, ret := h.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return enabled, pending, nil, profileMiB, fmt.Errorf("GetMaxMigDeviceCount: %v", ret)
	}
	for i := 0; i < max; i++ {
		md, ret := h.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND {
			continue
		}
		if ret != nvml.SUCCESS {
			return enabled, pending, nil, profileMiB, fmt.Errorf("GetMigDeviceHandleByIndex(%d): %v", i, ret)
		}
		d := MIGDevice{Handle: md, MIGDevice: api.MIGDevice{Health: api.Healthy}}
		if d.UUID, ret = md.GetUUID(); ret != nvml.SUCCESS {
			return enabled, pending, nil, profileMiB, fmt.Errorf("MIG device %d: GetUUID: %v", i, ret)
		}
		if d.GPUInstanceID, ret = md.GetGpuInstanceId(); ret != nvml.SUCCESS {
			return enabled, pending, nil, profileMiB, fmt.Errorf("MIG device %s: GetGpuInstanceId: %v", d.UUID, ret)
		}
		gi, ret := h.GetGpuInstanceById(d.GPUInstanceID)
		if ret != nvml.SUCCESS {
			return enabled, pending, nil, profileMiB, fmt.Errorf("MIG device %s: GetGpuInstanceById(%d): %v", d.UUID, d.GPUInstanceID, ret)
		}
		info, ret := gi.GetInfo()
		if ret != nvml.SUCCESS {
			return enabled, pending, nil, profileMiB, fmt.Errorf("MIG device %s: GPU instance info: %v", d.UUID, ret)
		}
		d.Start = int(info.Placement.Start)
		d.Profile = names[info.ProfileId]
		if mem, ret := md.GetMemoryInfo(); ret == nvml.SUCCESS {
			d.MemoryMiB = int64(mem.Total >> 20)
		}
		if attr, ret := md.GetAttributes(); ret == nvml.SUCCESS {
			d.SMCount = int(attr.MultiprocessorCount)
			if d.MemoryMiB == 0 {
				d.MemoryMiB = int64(attr.MemorySizeMB)
			}
			if d.Profile == "" && attr.GpuInstanceSliceCount > 0 {
				d.Profile = fmt.Sprintf("%dg.%dgb", attr.GpuInstanceSliceCount, (attr.MemorySizeMB+1023)/1024)
			}
		}
		if d.Profile == "" {
			return enabled, pending, nil, profileMiB, fmt.Errorf("MIG device %s: profile ID %d is not one Tessera knows", d.UUID, info.ProfileId)
		}
		devs = append(devs, d)
	}
	sort.Slice(devs, func(i, j int) bool { return devs[i].Start < devs[j].Start })
	return enabled, pending, devs, profileMiB, nil
}
