// Package recordsig signs and verifies allocation records
// (api.PodAllocation.Signature): the scheduler's proof that it wrote a
// record, which the node agent checks before it serves one and the
// scheduler checks when it rebuilds its state from records.
//
// A signature is "ed25519:<key id>:<base64 of the Ed25519 signature over
// api.SigningBytes(record)>". The signed bytes are the record's canonical
// wire form without the signature, so every field (node, the pod's UID,
// every grant) is covered: a record copied onto another pod, moved to
// another node or with one grant changed no longer verifies. A key's id is
// the first 8 bytes of the SHA-256 of its public key, in hex, so several
// keys can be valid at once while one is rotated out.
//
// The private keys live in a Secret only the scheduler may read; their
// public halves are published in a ConfigMap every node agent may read
// (Store, KeySource). See docs/security.md.
package recordsig

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// Scheme names the signature algorithm in a record's signature.
const Scheme = "ed25519"

// KeyID is the id of a public key: 16 hex digits of its SHA-256.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

func validKeyID(id string) bool {
	if len(id) != 16 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil && strings.ToLower(id) == id
}

// Signer signs records with one private key.
type Signer struct {
	id  string
	key ed25519.PrivateKey
}

// NewSigner returns a signer for the Ed25519 private key with this seed
// (ed25519.SeedSize bytes).
func NewSigner(seed []byte) (*Signer, error) {
	if len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("an Ed25519 seed is %d bytes, got %d", ed25519.SeedSize, len(seed))
	}
	key := ed25519.NewKeyFromSeed(seed)
	return &Signer{id: KeyID(key.Public().(ed25519.PublicKey)), key: key}, nil
}

// ID is the id of the signer's key.
func (s *Signer) ID() string { return s.id }

// Public is the signer's public key.
func (s *Signer) Public() ed25519.PublicKey { return s.key.Public().(ed25519.PublicKey) }

// Sign sets rec.Signature. The record must name its pod (PodUID): a
// signature that did not bind the record to one pod could be copied onto
// any other.
func (s *Signer) Sign(rec *api.PodAllocation) error {
	if rec.PodUID == "" {
		return errors.New("signing a GPU allocation record: it names no pod (podUID is empty)")
	}
	msg, err := api.SigningBytes(rec)
	if err != nil {
		return fmt.Errorf("signing a GPU allocation record: %w", err)
	}
	rec.Signature = Scheme + ":" + s.id + ":" + base64.StdEncoding.EncodeToString(ed25519.Sign(s.key, msg))
	return nil
}

// Keyring holds the public keys records are verified with, by id. The zero
// value holds none.
type Keyring struct {
	keys map[string]ed25519.PublicKey
}

// NewKeyring returns a keyring of the given keys.
func NewKeyring(pubs ...ed25519.PublicKey) *Keyring {
	k := &Keyring{keys: map[string]ed25519.PublicKey{}}
	for _, p := range pubs {
		k.keys[KeyID(p)] = p
	}
	return k
}

// IDs lists the keyring's key ids, sorted.
func (k *Keyring) IDs() []string {
	if k == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(k.keys))
}

// Has reports whether the keyring holds the key id.
func (k *Keyring) Has(id string) bool {
	if k == nil {
		return false
	}
	_, ok := k.keys[id]
	return ok
}

// ErrUnsigned is returned by Verify for a record without a signature.
var ErrUnsigned = errors.New("the record is not signed")

// ErrUnknownKey is wrapped by Verify's error for a signature by a key the
// keyring does not hold (not published, or retired).
var ErrUnknownKey = errors.New("signed by a key that is not published")

// KeyOf returns the key id a record's signature names ("" if it has none
// or it does not parse).
func KeyOf(rec *api.PodAllocation) string {
	_, id, _, err := split(rec.Signature)
	if err != nil {
		return ""
	}
	return id
}

func split(sig string) (scheme, id string, raw []byte, err error) {
	parts := strings.Split(sig, ":")
	if len(parts) != 3 {
		return "", "", nil, fmt.Errorf("signature %q is not \"<scheme>:<key id>:<base64>\"", sig)
	}
	if parts[0] != Scheme {
		return "", "", nil, fmt.Errorf("signature scheme %q is not %q", parts[0], Scheme)
	}
	if !validKeyID(parts[1]) {
		return "", "", nil, fmt.Errorf("signature key id %q is not 16 lowercase hex digits", parts[1])
	}
	raw, err = base64.StdEncoding.DecodeString(parts[2])
	if err != nil || len(raw) != ed25519.SignatureSize {
		return "", "", nil, fmt.Errorf("signature value is not %d bytes of base64", ed25519.SignatureSize)
	}
	return parts[0], parts[1], raw, nil
}

// Verify checks the record's signature: ErrUnsigned when it has none, an
// error wrapping ErrUnknownKey when the key is not in the keyring, and
// another error naming what is wrong otherwise. Verify says nothing about
// which pod the record is on: the caller compares rec.PodUID with it.
func (k *Keyring) Verify(rec *api.PodAllocation) error {
	if rec.Signature == "" {
		return ErrUnsigned
	}
	_, id, raw, err := split(rec.Signature)
	if err != nil {
		return err
	}
	pub, ok := k.keyOrNil(id)
	if !ok {
		return fmt.Errorf("%w: key %s (published: %s)", ErrUnknownKey, id, strings.Join(k.IDs(), ", "))
	}
	msg, err := api.SigningBytes(rec)
	if err != nil {
		return err
	}
	if !ed25519.Verify(pub, msg, raw) {
		return fmt.Errorf("signature by key %s does not match the record: it was changed after the scheduler signed it, or forged", id)
	}
	return nil
}

func (k *Keyring) keyOrNil(id string) (ed25519.PublicKey, bool) {
	if k == nil {
		return nil, false
	}
	p, ok := k.keys[id]
	return p, ok
}

// PublicData is the keyring as the public-key ConfigMap holds it: key id
// → base64 of the public key.
func (k *Keyring) PublicData() map[string]string {
	out := map[string]string{}
	if k == nil {
		return out
	}
	for id, p := range k.keys {
		out[id] = base64.StdEncoding.EncodeToString(p)
	}
	return out
}

// ParsePublicData reads a keyring from PublicData's form. Entries whose
// id does not match their key are refused, so a key cannot be published
// under another key's id.
func ParsePublicData(data map[string]string) (*Keyring, error) {
	k := NewKeyring()
	for _, id := range slices.Sorted(maps.Keys(data)) {
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(data[id]))
		if err != nil || len(raw) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("public key %s: not %d bytes of base64", id, ed25519.PublicKeySize)
		}
		if got := KeyID(raw); got != id {
			return nil, fmt.Errorf("public key %s: its id is %s", id, got)
		}
		k.keys[id] = raw
	}
	return k, nil
}
