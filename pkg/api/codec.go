package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// MaxAnnotationBytes bounds an encoded record. Kubernetes caps all of an
// object's annotations together at 256 KiB, so a larger value cannot have
// been written by Tessera; decoders refuse it before parsing.
const MaxAnnotationBytes = 256 << 10

// The wire formats are compact JSON. In memory, empty lists are nil: the
// decoders turn empty JSON arrays into nil so that Decode(Encode(x)) deep
// equals x, and the encoders write a nil GPU or container list as [].

// EncodeInventory returns the wire form of inv for AnnotationInventory.
// APIVersion and Kind are filled in when empty, and a MemoryOvercommit of
// 0 (unset) is written as 1.0 (no overcommit); inv itself is not modified.
// The result is validated first, so an invalid inventory is never written.
func EncodeInventory(inv *NodeInventory) ([]byte, error) {
	if inv == nil {
		return nil, errors.New("encoding GPU inventory: inventory is nil")
	}
	out := *inv
	if out.APIVersion == "" {
		out.APIVersion = InventoryAPIVersion
	}
	if out.Kind == "" {
		out.Kind = InventoryKind
	}
	if out.MemoryOvercommit == 0 {
		out.MemoryOvercommit = 1
	}
	if err := checkHeader("GPU inventory", out.APIVersion, InventoryAPIVersion, out.Kind, InventoryKind); err != nil {
		return nil, fmt.Errorf("encoding %w", err)
	}
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
	if err := readHeader(what, data, InventoryAPIVersion, InventoryKind); err != nil {
		return nil, err
	}
	inv := new(NodeInventory)
	if err := decodeJSON(data, inv, true); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", what, err)
	}
	if len(inv.GPUs) == 0 {
		inv.GPUs = nil
	}
	for i := range inv.GPUs {
		if len(inv.GPUs[i].Links) == 0 {
			inv.GPUs[i].Links = nil
		}
	}
	if err := ValidateInventory(inv); err != nil {
		return nil, fmt.Errorf("invalid %s: %w", what, err)
	}
	return inv, nil
}

// EncodeAllocation returns the wire form of a for AnnotationAllocation.
// APIVersion and Kind are filled in when empty; a itself is not modified.
func EncodeAllocation(a *PodAllocation) ([]byte, error) {
	if a == nil {
		return nil, errors.New("encoding GPU allocation: allocation is nil")
	}
	out := *a
	if out.APIVersion == "" {
		out.APIVersion = AllocationAPIVersion
	}
	if out.Kind == "" {
		out.Kind = AllocationKind
	}
	if err := checkHeader("GPU allocation", out.APIVersion, AllocationAPIVersion, out.Kind, AllocationKind); err != nil {
		return nil, fmt.Errorf("encoding %w", err)
	}
	if err := ValidateAllocation(&out); err != nil {
		return nil, fmt.Errorf("invalid GPU allocation: %w", err)
	}
	return marshalBounded("GPU allocation", &out)
}

// DecodeAllocation parses and validates an AnnotationAllocation value, as
// strictly as DecodeInventory.
func DecodeAllocation(data []byte) (*PodAllocation, error) {
	const what = "GPU allocation"
	if err := readHeader(what, data, AllocationAPIVersion, AllocationKind); err != nil {
		return nil, err
	}
	a := new(PodAllocation)
	if err := decodeJSON(data, a, true); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", what, err)
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
func readHeader(what string, data []byte, version, kind string) error {
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
	return checkHeader(what, h.APIVersion, version, h.Kind, kind)
}

func checkHeader(what, gotVersion, version, gotKind, kind string) error {
	if gotVersion != version {
		return fmt.Errorf("%s version %q is not supported (this build reads %s)", what, gotVersion, version)
	}
	if gotKind != kind {
		return fmt.Errorf("%s kind %q is not %q", what, gotKind, kind)
	}
	return nil
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
