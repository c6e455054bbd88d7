package recordsig

import (
	"context"
	"crypto/ed25519"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tessera-gpu/tessera/internal/testenv/poll"
	"github.com/tessera-gpu/tessera/pkg/api"
)

func record() *api.PodAllocation {
	return &api.PodAllocation{Node: "n1", PodUID: "6f1d0c2e-3b7a-4c55-9a0e-2f8b1d7c9e01", Containers: []api.ContainerAllocation{
		{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-00000001-0000-0000-0000-000000000000", MemoryMiB: 4096, Cores: 30}}},
	}}
}

func seed(b byte) []byte {
	s := make([]byte, ed25519.SeedSize)
	s[0] = b
	return s
}

func TestSignVerify(t *testing.T) {
	s, err := NewSigner(seed(1))
	if err != nil {
		t.Fatal(err)
	}
	ring := NewKeyring(s.Public())
	rec := record()
	if err := ring.Verify(rec); !errors.Is(err, ErrUnsigned) {
		t.Errorf("unsigned: %v", err)
	}
	if err := s.Sign(rec); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(rec.Signature, "ed25519:"+s.ID()+":") || KeyOf(rec) != s.ID() {
		t.Errorf("signature %q", rec.Signature)
	}
	if err := ring.Verify(rec); err != nil {
		t.Fatalf("verify: %v", err)
	}
	// The wire form round-trips with a valid signature.
	b, err := api.EncodeAllocation(rec)
	if err != nil {
		t.Fatal(err)
	}
	back, err := api.DecodeAllocation(b)
	if err != nil || ring.Verify(back) != nil {
		t.Fatalf("decoded: %v %v", err, ring.Verify(back))
	}
	// Every change breaks it.
	for name, change := range map[string]func(r *api.PodAllocation){
		"memory": func(r *api.PodAllocation) { r.Containers[0].Devices[0].MemoryMiB = 40960 },
		"cores":  func(r *api.PodAllocation) { r.Containers[0].Devices[0].Cores = 0 },
		"exclusive": func(r *api.PodAllocation) {
			r.Containers[0].Devices[0].Exclusive, r.Containers[0].Devices[0].Cores = true, 100
		},
		"gpu": func(r *api.PodAllocation) {
			r.Containers[0].Devices[0].UUID = "GPU-00000002-0000-0000-0000-000000000000"
		},
		"node":      func(r *api.PodAllocation) { r.Node = "n2" },
		"pod":       func(r *api.PodAllocation) { r.PodUID = "00000000-0000-0000-0000-000000000000" },
		"container": func(r *api.PodAllocation) { r.Containers[0].Name = "other" },
		"extra grant": func(r *api.PodAllocation) {
			r.Containers = append(r.Containers, api.ContainerAllocation{Name: "x", Devices: r.Containers[0].Devices})
		},
	} {
		r := *back
		r.Containers = append([]api.ContainerAllocation(nil), back.Containers...)
		r.Containers[0].Devices = append([]api.DeviceGrant(nil), back.Containers[0].Devices...)
		change(&r)
		if err := ring.Verify(&r); err == nil || !strings.Contains(err.Error(), "does not match") {
			t.Errorf("%s changed: %v", name, err)
		}
	}
	// Another key's signature is unknown to this keyring.
	other, _ := NewSigner(seed(2))
	r2 := record()
	_ = other.Sign(r2)
	if err := ring.Verify(r2); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("other key: %v", err)
	}
	// A forged id with the right key's signature value does not help.
	r3 := record()
	_ = s.Sign(r3)
	r3.Signature = strings.Replace(r3.Signature, s.ID(), other.ID(), 1)
	if err := NewKeyring(s.Public(), other.Public()).Verify(r3); err == nil {
		t.Error("a signature under another key id verified")
	}
	for _, bad := range []string{"x", "rsa:0123456789abcdef:AAAA", "ed25519:XYZ:AAAA", "ed25519:" + s.ID() + ":not-base64", "ed25519:" + s.ID() + ":AAAA"} {
		r := record()
		r.Signature = bad
		if err := ring.Verify(r); err == nil || errors.Is(err, ErrUnknownKey) || errors.Is(err, ErrUnsigned) {
			t.Errorf("signature %q: %v", bad, err)
		}
	}
	if err := s.Sign(&api.PodAllocation{Node: "n", Containers: record().Containers}); err == nil {
		t.Error("signed a record that names no pod")
	}
}

func TestPublicData(t *testing.T) {
	a, _ := NewSigner(seed(1))
	b, _ := NewSigner(seed(2))
	ring := NewKeyring(a.Public(), b.Public())
	back, err := ParsePublicData(ring.PublicData())
	if err != nil || len(back.IDs()) != 2 || !back.Has(a.ID()) || !back.Has(b.ID()) {
		t.Fatalf("%v %v", back.IDs(), err)
	}
	data := ring.PublicData()
	data[a.ID()] = data[b.ID()] // b's key published under a's id
	if _, err := ParsePublicData(data); err == nil || !strings.Contains(err.Error(), "its id is") {
		t.Errorf("mislabelled key: %v", err)
	}
}

// TestStore: the first start creates the Secret and publishes the public
// key; a second replica loads the same key; a rotated Secret signs with
// the new key and publishes both.
func TestStore(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	st := Store{}
	s1, ring1, err := st.LoadOrCreate(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	s2, _, err := st.LoadOrCreate(ctx, client)
	if err != nil || s2.ID() != s1.ID() {
		t.Fatalf("second replica: %v, id %s vs %s", err, s2.ID(), s1.ID())
	}
	cm, err := client.CoreV1().ConfigMaps(DefaultNamespace).Get(ctx, DefaultPublicKeys, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := ParsePublicData(cm.Data)
	if err != nil || !pub.Has(s1.ID()) || len(ring1.IDs()) != 1 {
		t.Fatalf("published %v: %v", cm.Data, err)
	}
	// Rotation: a second key, made active.
	sec, _ := client.CoreV1().Secrets(DefaultNamespace).Get(ctx, DefaultSecret, metav1.GetOptions{})
	nk, _ := NewSigner(seed(9))
	sec.Data[nk.ID()] = seed(9)
	sec.Data[ActiveKey] = []byte(nk.ID())
	if _, err := client.CoreV1().Secrets(DefaultNamespace).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s3, ring3, err := st.LoadOrCreate(ctx, client)
	if err != nil || s3.ID() != nk.ID() || !ring3.Has(s1.ID()) {
		t.Fatalf("rotated: %v %s %v", err, s3.ID(), ring3.IDs())
	}
	cm, _ = client.CoreV1().ConfigMaps(DefaultNamespace).Get(ctx, DefaultPublicKeys, metav1.GetOptions{})
	if len(cm.Data) != 2 {
		t.Errorf("after rotation the ConfigMap holds %v", cm.Data)
	}
	// A Secret whose active key is missing is refused.
	sec.Data[ActiveKey] = []byte("0123456789abcdef")
	_, _ = client.CoreV1().Secrets(DefaultNamespace).Update(ctx, sec, metav1.UpdateOptions{})
	if _, _, err := st.LoadOrCreate(ctx, client); err == nil || !strings.Contains(err.Error(), "not among the keys") {
		t.Errorf("missing active key: %v", err)
	}
}

// TestKeySource: a verifier learns a key published after it started, by
// its watch or by reading the ConfigMap when a record names it.
func TestKeySource(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset()
	// The fake clientset drops events between its list and its watch:
	// note when the source's watch is registered with the fake.
	watching := make(chan struct{})
	var once sync.Once
	client.PrependWatchReactor("configmaps", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace(), a.(k8stesting.WatchActionImpl).ListOptions)
		if err == nil {
			once.Do(func() { close(watching) })
		}
		return true, w, err
	})
	src := NewKeySource(client, Store{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = src.Run(ctx) }()
	defer wg.Wait()
	defer cancel()
	rec := record()
	signer, _, err := Store{}.LoadOrCreate(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	seen := func() int {
		src.mu.Lock()
		defer src.mu.Unlock()
		return src.events
	}
	if err := signer.Sign(rec); err != nil {
		t.Fatal(err)
	}
	// Right after publication: the direct read finds the key.
	if err := src.Verify(ctx, rec); err != nil {
		t.Fatalf("verify after publication: %v", err)
	}
	rec.Containers[0].Devices[0].MemoryMiB++
	if err := src.Verify(ctx, rec); err == nil {
		t.Error("a changed record verified")
	}
	// Removing the ConfigMap retires every key once the watch sees it:
	// delete it once the watch is registered and has delivered it.
	select {
	case <-watching:
	case <-time.After(10 * time.Second):
		t.Fatal("the key source never watched the ConfigMap")
	}
	poll.Until(t, "the watch to deliver the ConfigMap", 10*time.Second, func() bool { return seen() > 0 })
	if err := client.CoreV1().ConfigMaps(DefaultNamespace).Delete(ctx, DefaultPublicKeys, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.Containers[0].Devices[0].MemoryMiB--
	poll.Until(t, "the withdrawn keys unknown", 10*time.Second, func() bool {
		err = src.Verify(ctx, rec)
		return err != nil
	})
	if !errors.Is(err, ErrUnknownKey) {
		t.Errorf("after the keys were withdrawn: %v", err)
	}
}
