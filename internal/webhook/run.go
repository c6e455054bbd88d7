package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Inventories tracks the largest GPU of each node from the nodes'
// inventory annotations.
type Inventories struct {
	logger  klog.Logger
	mu      sync.RWMutex
	largest map[string]int64
}

// NewInventories returns an empty tracker that logs unreadable
// inventories to logger.
func NewInventories(logger klog.Logger) *Inventories {
	return &Inventories{logger: logger, largest: map[string]int64{}}
}

// Set records a node's inventory annotation. A node without one, or with
// one that does not decode (logged), has no GPUs (kubeobj.Inventory).
func (iv *Inventories) Set(node *corev1.Node) {
	var m int64
	inv, err := kubeobj.Inventory(node)
	if err != nil {
		iv.logger.Error(err, "Ignoring the node's GPU inventory", "node", klog.KObj(node))
	}
	if inv != nil {
		for _, g := range inv.GPUs {
			m = max(m, g.MemoryMiB)
		}
	}
	iv.mu.Lock()
	defer iv.mu.Unlock()
	if m == 0 {
		delete(iv.largest, node.Name)
		return
	}
	iv.largest[node.Name] = m
}

// Delete forgets a node.
func (iv *Inventories) Delete(name string) {
	iv.mu.Lock()
	defer iv.mu.Unlock()
	delete(iv.largest, name)
}

// Largest is the memory of the largest GPU on any node, 0 if none.
func (iv *Inventories) Largest() int64 {
	iv.mu.RLock()
	defer iv.mu.RUnlock()
	var m int64
	for _, v := range iv.largest {
		m = max(m, v)
	}
	return m
}

// Watch keeps iv up to date from a Node informer.
func (iv *Inventories) Watch(inf cache.SharedIndexInformer) (cache.ResourceEventHandlerRegistration, error) {
	return inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { iv.setObj(obj) },
		UpdateFunc: func(old, obj any) {
			// Most node updates are status heartbeats: decode only when
			// the inventory annotation itself changed.
			o, ok1 := old.(*corev1.Node)
			n, ok2 := obj.(*corev1.Node)
			if ok1 && ok2 && o.Annotations[api.AnnotationInventory] == n.Annotations[api.AnnotationInventory] {
				return
			}
			iv.setObj(obj)
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if n, ok := obj.(*corev1.Node); ok {
				iv.Delete(n.Name)
			}
		},
	})
}

func (iv *Inventories) setObj(obj any) {
	if n, ok := obj.(*corev1.Node); ok {
		iv.Set(n)
	}
}

// Options configure Run.
type Options struct {
	Client kubernetes.Interface
	Names  api.ResourceNames
	// SchedulerName is set on GPU pods that name the default scheduler.
	SchedulerName string
	// Listen is the TLS listen address, e.g. ":8443" or "127.0.0.1:0".
	Listen string
	// Hosts are the names in the serving certificate (ServiceHosts, or an
	// IP address for tests).
	Hosts []string
	// CASecretNamespace/CASecretName keep the CA shared by replicas; when
	// empty, each start issues a fresh CA (single replica, tests).
	CASecretNamespace, CASecretName string
	// Registration is written with the CA when Register is true. With
	// neither URL nor ServiceName set it points at the listen address.
	Registration Registration
	Register     bool
	// Ready, if set, receives the listen address once the webhook serves
	// and its configurations are written.
	Ready func(addr string)
	// SchedulerUsers may write allocation records (default
	// DefaultSchedulerUser).
	SchedulerUsers []string
	// TrustedNamespaces are exempt from the isolation checks ("*": every
	// namespace, the cluster-wide opt-out); so is every namespace labelled
	// TrustedLabel=true.
	TrustedNamespaces []string
	// AllowUnprefixedEnvFrom: see Admission.
	AllowUnprefixedEnvFrom bool
}

// trustedNamespaces answers Admission.Trusted from a list and the
// namespaces' TrustedLabel.
type trustedNamespaces struct {
	listed map[string]bool
	mu     sync.RWMutex
	label  map[string]bool
}

func (t *trustedNamespaces) trusted(ns string) bool {
	if t.listed["*"] || t.listed[ns] {
		return true
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.label[ns]
}

func (t *trustedNamespaces) watch(inf cache.SharedIndexInformer) error {
	set := func(obj any) {
		if n, ok := obj.(*corev1.Namespace); ok {
			t.mu.Lock()
			if n.Labels[TrustedLabel] == "true" {
				t.label[n.Name] = true
			} else {
				delete(t.label, n.Name)
			}
			t.mu.Unlock()
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, obj any) { set(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if n, ok := obj.(*corev1.Namespace); ok {
				t.mu.Lock()
				delete(t.label, n.Name)
				t.mu.Unlock()
			}
		},
	})
	return err
}

// Run serves the webhook until ctx ends: it issues its certificate, starts
// watching node inventories, listens, and writes its CA into its webhook
// configurations.
func Run(ctx context.Context, o Options) error {
	logger := klog.FromContext(ctx).WithName("webhook")
	if len(o.Hosts) == 0 {
		return errors.New("no host names for the serving certificate")
	}
	var ca *CA
	var err error
	if o.CASecretName != "" {
		ca, err = LoadOrCreateCA(ctx, o.Client, o.CASecretNamespace, o.CASecretName)
	} else {
		ca, err = NewCA("tessera-webhook-ca")
	}
	if err != nil {
		return fmt.Errorf("webhook CA: %w", err)
	}
	cert, err := ca.ServingCert(o.Hosts)
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}

	inv := NewInventories(logger)
	factory := informers.NewSharedInformerFactory(o.Client, 0)
	if _, err := inv.Watch(factory.Core().V1().Nodes().Informer()); err != nil {
		return err
	}
	trust := &trustedNamespaces{listed: map[string]bool{}, label: map[string]bool{}}
	for _, ns := range o.TrustedNamespaces {
		trust.listed[ns] = true
	}
	if err := trust.watch(factory.Core().V1().Namespaces().Informer()); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	factory.WaitForCacheSync(ctx.Done())

	adm := &Admission{
		Names: o.Names, SchedulerName: o.SchedulerName, LargestGPUMiB: inv.Largest,
		SchedulerUsers: o.SchedulerUsers, Trusted: trust.trusted, AllowUnprefixedEnvFrom: o.AllowUnprefixedEnvFrom,
		Claims: ClientClaims{Client: o.Client},
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", o.Listen, err)
	}
	srv := &http.Server{
		Handler:           adm.Handler(logger),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
	}
	errCh := make(chan error, 1)
	go func() { errCh <- srv.ServeTLS(ln, "", "") }()

	if o.Register {
		reg := o.Registration
		reg.CABundle = ca.CertPEM
		reg.Names = o.Names
		reg.SchedulerUsers = o.SchedulerUsers
		if reg.URL == "" && reg.ServiceName == "" {
			// No Service: the API server calls the listener directly.
			reg.URL = "https://" + ln.Addr().String()
		}
		if err := reg.Apply(ctx, o.Client); err != nil {
			_ = srv.Close()
			return err
		}
	}
	logger.Info("Webhook serving", "address", ln.Addr().String(), "hosts", o.Hosts)
	if o.Ready != nil {
		o.Ready(ln.Addr().String())
	}
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		return nil
	case err := <-errCh:
		return fmt.Errorf("serving: %w", err)
	}
}
