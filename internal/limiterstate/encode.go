package limiterstate

// Encode writes s in the file layout, initialised and consistent (even
// sequence number): what the limiter's shared-state file holds once its
// processes have registered. A snapshot with Version 3 is written as a
// version-3 file (no counters); any other as version 4. The limiter (C) is the only writer of real
// files; Encode is for tests and tools that need a state file without a
// CUDA process (the node agent's metrics tests). Processes beyond
// MaxProcs are dropped.
func Encode(s *Snapshot) []byte {
	v, size := Version, StateSize
	if s.Version == VersionV3 {
		v, size = VersionV3, StateSizeV3
	}
	b := make([]byte, size)
	le.PutUint64(b[OffMagic:], Magic)
	le.PutUint32(b[OffVersion:], v)
	le.PutUint32(b[OffHeaderSize:], HeaderSize)
	le.PutUint32(b[OffSlotSize:], SlotSize)
	le.PutUint32(b[OffMaxDevices:], MaxDevices)
	le.PutUint32(b[OffMaxProcs:], MaxProcs)
	le.PutUint32(b[OffInitState:], InitReady)
	le.PutUint64(b[OffSeq:], s.Seq&^1)
	for d := 0; d < MaxDevices; d++ {
		le.PutUint64(b[OffLimit+8*d:], s.Devices[d].Limit)
		le.PutUint64(b[OffTotalUsed+8*d:], s.Devices[d].Used)
		le.PutUint32(b[OffSMLimit+4*d:], s.Devices[d].SMLimit)
		if v == Version {
			le.PutUint64(b[OffCounters+CountersOffThrottledNs+8*d:], s.Devices[d].ThrottledNs)
			le.PutUint64(b[OffCounters+CountersOffRefused+8*d:], s.Devices[d].RefusedAllocations)
		}
	}
	le.PutUint64(b[OffReclaimed:], s.ReclaimedProcesses)
	for i, p := range s.Processes {
		if i >= MaxProcs {
			break
		}
		o := OffSlots + i*SlotSize
		le.PutUint32(b[o+SlotOffPID:], uint32(p.PID))
		le.PutUint32(b[o+SlotOffHostPID:], uint32(p.HostPID))
		le.PutUint64(b[o+SlotOffPIDNS:], p.PIDNamespace)
		for d := 0; d < MaxDevices; d++ {
			le.PutUint64(b[o+SlotOffUsed+8*d:], p.Used[d])
		}
	}
	return b
}
