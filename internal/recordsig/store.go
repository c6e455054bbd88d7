package recordsig

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// Defaults of Store.
const (
	DefaultNamespace  = "tessera-system"
	DefaultSecret     = "tessera-record-signing-key"
	DefaultPublicKeys = "tessera-record-keys"
)

// ActiveKey is the Secret data key naming the key id records are signed
// with; every other data key is a key id whose value is that key's
// 32-byte Ed25519 seed.
const ActiveKey = "active"

// Store says where the keys live: the private keys in a Secret only the
// scheduler's identity may read, their public halves in a ConfigMap every
// node agent may read.
type Store struct {
	Namespace  string
	Secret     string
	PublicKeys string
}

func (s Store) withDefaults() Store {
	if s.Namespace == "" {
		s.Namespace = DefaultNamespace
	}
	if s.Secret == "" {
		s.Secret = DefaultSecret
	}
	if s.PublicKeys == "" {
		s.PublicKeys = DefaultPublicKeys
	}
	return s
}

// LoadOrCreate reads the scheduler's keys from the Secret, creating it
// with a fresh key on first start (replicas racing to create it all end
// up with the one that was stored), and publishes every key's public half
// in the ConfigMap before it returns, so no record is signed with a key
// agents cannot know. It returns the signer of the active key and the
// keyring of every key in the Secret (rotation: a new key is added and
// made active; the old one stays until no record carries its signature).
func (s Store) LoadOrCreate(ctx context.Context, client kubernetes.Interface) (*Signer, *Keyring, error) {
	s = s.withDefaults()
	secrets := client.CoreV1().Secrets(s.Namespace)
	sec, err := secrets.Get(ctx, s.Secret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		seed := make([]byte, ed25519.SeedSize)
		if _, err := rand.Read(seed); err != nil {
			return nil, nil, err
		}
		signer, _ := NewSigner(seed)
		sec = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Secret, Labels: map[string]string{"app.kubernetes.io/part-of": "tessera"}},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{ActiveKey: []byte(signer.ID()), signer.ID(): seed},
		}
		created, cerr := secrets.Create(ctx, sec, metav1.CreateOptions{})
		switch {
		case cerr == nil:
			sec, err = created, nil
		case apierrors.IsAlreadyExists(cerr):
			sec, err = secrets.Get(ctx, s.Secret, metav1.GetOptions{})
		default:
			return nil, nil, fmt.Errorf("creating the record signing key Secret %s/%s: %w", s.Namespace, s.Secret, cerr)
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading the record signing key Secret %s/%s: %w", s.Namespace, s.Secret, err)
	}
	signer, ring, err := parseSecret(sec.Data)
	if err != nil {
		return nil, nil, fmt.Errorf("the record signing key Secret %s/%s: %w", s.Namespace, s.Secret, err)
	}
	if err := s.publish(ctx, client, ring); err != nil {
		return nil, nil, err
	}
	return signer, ring, nil
}

func parseSecret(data map[string][]byte) (*Signer, *Keyring, error) {
	active := string(data[ActiveKey])
	if active == "" {
		return nil, nil, fmt.Errorf("no %q entry naming the key to sign with", ActiveKey)
	}
	ring := NewKeyring()
	var signer *Signer
	for _, id := range slices.Sorted(maps.Keys(data)) {
		if id == ActiveKey {
			continue
		}
		sg, err := NewSigner(data[id])
		if err != nil {
			return nil, nil, fmt.Errorf("key %s: %w", id, err)
		}
		if sg.ID() != id {
			return nil, nil, fmt.Errorf("key %s: its id is %s", id, sg.ID())
		}
		ring.keys[id] = sg.Public()
		if id == active {
			signer = sg
		}
	}
	if signer == nil {
		return nil, nil, fmt.Errorf("active key %s is not among the keys", active)
	}
	return signer, ring, nil
}

// publish writes the keyring's public keys into the ConfigMap.
func (s Store) publish(ctx context.Context, client kubernetes.Interface, ring *Keyring) error {
	cms := client.CoreV1().ConfigMaps(s.Namespace)
	want := ring.PublicData()
	cm, err := cms.Get(ctx, s.PublicKeys, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.PublicKeys, Labels: map[string]string{"app.kubernetes.io/part-of": "tessera"}},
			Data:       want,
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return s.publish(ctx, client, ring)
		}
	case err == nil:
		if maps.Equal(cm.Data, want) {
			return nil
		}
		cm = cm.DeepCopy()
		cm.Data = want
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("publishing the record public keys in ConfigMap %s/%s: %w", s.Namespace, s.PublicKeys, err)
	}
	return nil
}

// KeySource keeps the published public keys of a Store current for a
// verifier (the node agent): a watch on the ConfigMap, and a direct read
// when a record names a key the watch has not delivered yet (the scheduler
// publishes a new key just before its first signature).
type KeySource struct {
	client    kubernetes.Interface
	namespace string
	name      string

	mu      sync.Mutex
	ring    *Keyring
	err     error // last error reading the ConfigMap
	fetched time.Time
	events  int // ConfigMap events seen by the watch (tests)
}

// NewKeySource returns a source of the Store's public keys.
func NewKeySource(client kubernetes.Interface, s Store) *KeySource {
	s = s.withDefaults()
	return &KeySource{client: client, namespace: s.Namespace, name: s.PublicKeys, ring: NewKeyring()}
}

// Run watches the ConfigMap until ctx ends.
func (k *KeySource) Run(ctx context.Context) error {
	f := informers.NewSharedInformerFactoryWithOptions(k.client, 10*time.Minute,
		informers.WithNamespace(k.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", k.name).String()
		}))
	inf := f.Core().V1().ConfigMaps().Informer()
	set := func(obj any) {
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			k.watched(cm)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, obj any) { set(obj) },
		DeleteFunc: func(any) { k.watched(nil) },
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	<-ctx.Done()
	return nil
}

func (k *KeySource) watched(cm *corev1.ConfigMap) {
	k.mu.Lock()
	k.events++
	k.mu.Unlock()
	k.set(cm)
}

func (k *KeySource) set(cm *corev1.ConfigMap) {
	ring, err := NewKeyring(), error(nil)
	if cm != nil {
		ring, err = ParsePublicData(cm.Data)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if err != nil {
		k.err = fmt.Errorf("ConfigMap %s/%s: %w", k.namespace, k.name, err)
		return
	}
	k.ring, k.err = ring, nil
}

// refresh reads the ConfigMap now, at most once a second.
func (k *KeySource) refresh(ctx context.Context) {
	k.mu.Lock()
	if time.Since(k.fetched) < time.Second {
		k.mu.Unlock()
		return
	}
	k.fetched = time.Now()
	k.mu.Unlock()
	cm, err := k.client.CoreV1().ConfigMaps(k.namespace).Get(ctx, k.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		k.set(nil)
	case err != nil:
		k.mu.Lock()
		k.err = fmt.Errorf("reading ConfigMap %s/%s: %w", k.namespace, k.name, err)
		k.mu.Unlock()
	default:
		k.set(cm)
	}
}

// Verify verifies the record against the published keys, reading them
// afresh once when the record names a key not yet seen.
func (k *KeySource) Verify(ctx context.Context, rec *api.PodAllocation) error {
	k.mu.Lock()
	ring := k.ring
	k.mu.Unlock()
	err := ring.Verify(rec)
	if !errors.Is(err, ErrUnknownKey) {
		return err
	}
	k.refresh(ctx)
	k.mu.Lock()
	ring, rerr := k.ring, k.err
	k.mu.Unlock()
	if err = ring.Verify(rec); errors.Is(err, ErrUnknownKey) && rerr != nil {
		return fmt.Errorf("%w (%v)", err, rerr)
	}
	return err
}
