package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// MaxAnnotationBytes bounds an encoded record. Kubernetes caps all of an
// object's annotations together at 256 KiB, so a larger value cannot have
// been written by Tessera; decoders refuse it before parsing.
const MaxAnnotationBytes = 256 << 10

// The wire formats are compact JSON. In memory, empty lists are nil: the
// decoders turn empty JSON arrays into nil so that Decode(Encode(x)) deep
// equals x, and the encoders write a nil GPU or container list as [].

// inventoryVersions and allocationVersions are the versions this build
// reads, oldest first.
var (
	inventoryVersions  = []string{InventoryAPIVersionV1, InventoryAPIVersionV2, InventoryAPIVersion}
	allocationVersions = []string{AllocationAPIVersionV1, AllocationAPIVersionV2, AllocationAPIVersion}
)

// EncodeInventory returns the wire form of inv for AnnotationInventory, in
// the lowest version that expresses it (tessera.io/v1 unless a field of a
// later version is used), whatever inv.APIVersion says (it must be empty or a version this
// build reads). Kind is filled in when empty, and a MemoryOvercommit of 0
// (unset) is written as 1.0 (no overcommit); inv itself is not modified.
// The result is validated first, so an invalid inventory is never written.
func EncodeInventory(inv *NodeInventory) ([]byte, error) {
	if inv == nil {
		return nil, errors.New("encoding GPU inventory: inventory is nil")
	}
	out := *inv
	if out.APIVersion == "" {
		out.APIVersion = InventoryAPIVersionV1
	}
	if out.Kind == "" {
		out.Kind = InventoryKind
	}
	if out.MemoryOvercommit == 0 {
		out.MemoryOvercommit = 1
	}
	if err := checkHeader("GPU inventory", out.APIVersion, inventoryVersions, out.Kind, InventoryKind); err != nil {
		return nil, fmt.Errorf("encoding %w", err)
	}
	out.APIVersion, _ = inventoryNeeds(&out)
	if err := ValidateInventory(&out); err != nil {
		return nil, fmt.Errorf("invalid GPU inventory: %w", err)
	}
	if out.GPUs == nil {
		out.GPUs = []GPU{}
	}
	return marshalBounded("GPU inventory", &out)
}

// DecodeInventory parses and validates an AnnotationInventory value. It
// refuses oversized input, other versions and kinds, unknown fields and
// trailing data, so a node agent newer than the scheduler is reported
// rather than half understood.
func DecodeInventory(data []byte) (*NodeInventory, error) {
	const what = "GPU inventory"
	if err := readHeader(what, data, inventoryVersions, InventoryKind); err != nil {
		return nil, err
	}
	inv := new(NodeInventory)
	if err := decodeJSON(data, inv, true); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", what, err)
	}
	if need, f := inventoryNeeds(inv); newer(inventoryVersions, need, inv.APIVersion) {
		return nil, fmt.Errorf("decoding %s: %s is not part of %s (it needs %s)", what, f, inv.APIVersion, need)
	}
	if len(inv.GPUs) == 0 {
		inv.GPUs = nil
	}
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		if len(g.Links) == 0 {
			g.Links = nil
		}
		if len(g.MIG.Devices) == 0 {
			g.MIG.Devices = nil
		}
		if len(g.MIG.ProfileMemoryMiB) == 0 {
			g.MIG.ProfileMemoryMiB = nil
		}
	}
	if err := ValidateInventory(inv); err != nil {
		return nil, fmt.Errorf("invalid %s: %w", what, err)
	}
	return inv, nil
}

// EncodeAllocation returns the wire form of a for AnnotationAllocation, in
// the lowest version that expresses it, as EncodeInventory does; a itself
// is not modified.
func EncodeAllocation(a *PodAllocation) ([]byte, error) {
	if a == nil {
		return nil, errors.New("encoding GPU allocation: allocation is nil")
	}
	out := *a
	if out.APIVersion == "" {
		out.APIVersion = AllocationAPIVersionV1
	}
	if out.Kind == "" {
		out.Kind = AllocationKind
	}
	if err := checkHeader("GPU allocation", out.APIVersion, allocationVersions, out.Kind, AllocationKind); err != nil {
		return nil, fmt.Errorf("encoding %w", err)
	}
	out.APIVersion, _ = allocationNeeds(&out)
	if err := ValidateAllocation(&out); err != nil {
		return nil, fmt.Errorf("invalid GPU allocation: %w", err)
	}
	return marshalBounded("GPU allocation", &out)
}

// DecodeAllocation parses and validates an AnnotationAllocation value, as
// strictly as DecodeInventory.
func DecodeAllocation(data []byte) (*PodAllocation, error) {
	const what = "GPU allocation"
	if err := readHeader(what, data, allocationVersions, AllocationKind); err != nil {
		return nil, err
	}
	a := new(PodAllocation)
	if err := decodeJSON(data, a, true); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", what, err)
	}
	if need, f := allocationNeeds(a); newer(allocationVersions, need, a.APIVersion) {
		return nil, fmt.Errorf("decoding %s: %s is not part of %s (it needs %s)", what, f, a.APIVersion, need)
	}
	if len(a.Containers) == 0 {
		a.Containers = nil
	}
	for i := range a.Containers {
		if len(a.Containers[i].Devices) == 0 {
			a.Containers[i].Devices = nil
		}
	}
	if err := ValidateAllocation(a); err != nil {
		return nil, fmt.Errorf("invalid %s: %w", what, err)
	}
	return a, nil
}

// readHeader checks size, apiVersion and kind before the strict decode, so
// that a record of another version fails with a version error rather than
// with an unknown-field error.
func readHeader(what string, data []byte, versions []string, kind string) error {
	if len(data) > MaxAnnotationBytes {
		return fmt.Errorf("%s is %d bytes, more than the limit of %d", what, len(data), MaxAnnotationBytes)
	}
	var h struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := decodeJSON(data, &h, false); err != nil {
		return fmt.Errorf("decoding %s: %w", what, err)
	}
	return checkHeader(what, h.APIVersion, versions, h.Kind, kind)
}

func checkHeader(what, gotVersion string, versions []string, gotKind, kind string) error {
	known := false
	for _, v := range versions {
		known = known || gotVersion == v
	}
	if !known {
		return fmt.Errorf("%s version %q is not supported (this build reads %s)", what, gotVersion, joinVersions(versions))
	}
	if gotKind != kind {
		return fmt.Errorf("%s kind %q is not %q", what, gotKind, kind)
	}
	return nil
}

// joinVersions lists versions as "a", "a and b" or "a, b and c".
func joinVersions(v []string) string {
	if len(v) < 2 {
		return strings.Join(v, "")
	}
	return strings.Join(v[:len(v)-1], ", ") + " and " + v[len(v)-1]
}

// decodeJSON decodes exactly one JSON value from data into v.
func decodeJSON(data []byte, v any, strict bool) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("empty input")
		}
		return err
	}
	end := dec.InputOffset()
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("trailing data after the JSON value (offset %d)", end)
	}
	return nil
}

func marshalBounded(what string, v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding %s: %w", what, err)
	}
	if len(data) > MaxAnnotationBytes {
		return nil, fmt.Errorf("encoded %s is %d bytes, more than the limit of %d", what, len(data), MaxAnnotationBytes)
	}
	return data, nil
}

// newer reports whether version a comes after version b in versions
// (oldest first; both are known).
func newer(versions []string, a, b string) bool {
	return slices.Index(versions, a) > slices.Index(versions, b)
}

// inventoryNeeds returns the lowest version that expresses inv and the
// first field that needs it ("" for tessera.io/v1). A field added by a
// later version goes into that version's function; a version bump adds a
// function and a case here.
func inventoryNeeds(inv *NodeInventory) (version, field string) {
	if f := inventoryV3Field(inv); f != "" {
		return InventoryAPIVersion, f
	}
	if f := inventoryV2Field(inv); f != "" {
		return InventoryAPIVersionV2, f
	}
	return InventoryAPIVersionV1, ""
}

// allocationNeeds is inventoryNeeds for allocation records.
func allocationNeeds(a *PodAllocation) (version, field string) {
	if f := allocationV3Field(a); f != "" {
		return AllocationAPIVersion, f
	}
	if f := allocationV2Field(a); f != "" {
		return AllocationAPIVersionV2, f
	}
	return AllocationAPIVersionV1, ""
}

// inventoryV3Field names the first field of inv that tessera.io/v2 cannot
// express, or returns "".
func inventoryV3Field(inv *NodeInventory) string {
	for i := range inv.GPUs {
		if inv.GPUs[i].DriverMemoryLimits {
			return fmt.Sprintf("gpus[%d].driverMemoryLimits", i)
		}
	}
	return ""
}

// allocationV3Field names the first field of a that tessera.io/v2 cannot
// express, or returns "".
func allocationV3Field(a *PodAllocation) string {
	for i := range a.Containers {
		for k, d := range a.Containers[i].Devices {
			if d.CeilingMiB != 0 {
				return fmt.Sprintf("containers[%d].devices[%d].ceilingMiB", i, k)
			}
		}
	}
	return ""
}

// inventoryV2Field names the first field of inv that tessera.io/v1 cannot
// express, or returns "".
func inventoryV2Field(inv *NodeInventory) string {
	switch {
	case inv.Mode != "":
		return "mode"
	case inv.MIGStrategy != "":
		return "migStrategy"
	}
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		switch {
		case len(g.MIG.Devices) > 0:
			return fmt.Sprintf("gpus[%d].mig.devices", i)
		case len(g.MIG.ProfileMemoryMiB) > 0:
			return fmt.Sprintf("gpus[%d].mig.profileMemoryMiB", i)
		case g.Sharing == SharingMPS || g.Sharing == SharingMIG || g.Sharing == SharingMIGDynamic:
			return fmt.Sprintf("gpus[%d].sharing %q", i, g.Sharing)
		}
	}
	return ""
}

// allocationV2Field names the first field of a that tessera.io/v1 cannot
// express, or returns "".
func allocationV2Field(a *PodAllocation) string {
	switch {
	case a.PodUID != "":
		return "podUID"
	case a.Signature != "":
		return "signature"
	}
	for i := range a.Containers {
		for k, d := range a.Containers[i].Devices {
			if d.MIG != nil {
				return fmt.Sprintf("containers[%d].devices[%d].mig", i, k)
			}
		}
	}
	return ""
}

// SigningBytes is what a record's Signature signs: the record's wire form
// with the signature left out. A verifier decodes the record (which
// validates it), takes SigningBytes of the result and checks the
// signature against it, so any change to a signed field breaks it.
func SigningBytes(a *PodAllocation) ([]byte, error) {
	if a == nil {
		return nil, errors.New("signing GPU allocation: allocation is nil")
	}
	out := *a
	out.Signature = ""
	return EncodeAllocation(&out)
}
