package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/kubeobj"
	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// Inventories tracks, from the nodes' inventory annotations, the largest
// GPU of each node and the GPUs that give shares MIG devices (quota.go).
type Inventories struct {
	logger  klog.Logger
	mu      sync.RWMutex
	largest map[string]int64
	mig     map[string]migGPUs
}

// migGPUs are a node's GPUs in a MIG sharing mode, with its strategy.
type migGPUs struct {
	strategy api.MIGStrategy
	gpus     []api.GPU
}

// NewInventories returns an empty tracker that logs unreadable
// inventories to logger.
func NewInventories(logger klog.Logger) *Inventories {
	return &Inventories{logger: logger, largest: map[string]int64{}, mig: map[string]migGPUs{}}
}

// Set records a node's inventory annotation. A node without one, or with
// one that does not decode (logged), has no GPUs (kubeobj.Inventory).
func (iv *Inventories) Set(node *corev1.Node) {
	var m int64
	var mg migGPUs
	inv, err := kubeobj.Inventory(node)
	if err != nil {
		iv.logger.Error(err, "Ignoring the node's GPU inventory", "node", klog.KObj(node))
	}
	if inv != nil {
		mg.strategy = inv.MIGStrategy
		for _, g := range inv.GPUs {
			m = max(m, g.MemoryMiB)
			if g.Sharing == api.SharingMIG || g.Sharing == api.SharingMIGDynamic {
				mg.gpus = append(mg.gpus, g)
			}
		}
	}
	iv.mu.Lock()
	defer iv.mu.Unlock()
	if len(mg.gpus) > 0 {
		iv.mig[node.Name] = mg
	} else {
		delete(iv.mig, node.Name)
	}
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
	delete(iv.mig, name)
}

// MIGShareMiB is the most memory a share asking memMiB (or memPercent of
// a GPU) and cores percent is given as a MIG device on any node
// (placement.MIGShareMiB); 0 when no node gives shares MIG devices.
func (iv *Inventories) MIGShareMiB(memMiB, memPercent int64, cores int) int64 {
	iv.mu.RLock()
	defer iv.mu.RUnlock()
	var m int64
	for _, n := range iv.mig {
		for _, g := range n.gpus {
			if v, ok := placement.MIGShareMiB(g, n.strategy, memMiB, memPercent, cores); ok {
				m = max(m, v)
			}
		}
	}
	return m
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
	// StartTimeout bounds the start before serving (the CA, the
	// informers' sync, the configurations' registration); 0 means
	// DefaultStartTimeout.
	StartTimeout time.Duration
	// SchedulerUsers may write allocation records (default
	// DefaultSchedulerUser).
	SchedulerUsers []string
	// TrustedNamespaces are exempt from the isolation checks ("*": every
	// namespace, the cluster-wide opt-out); so is every namespace labelled
	// TrustedLabel=true.
	TrustedNamespaces []string
	// AllowUnprefixedEnvFrom, DeviceListStrategy, UnprefixedEnvFrom and
	// Audit: see Admission. DeviceListStrategy is also the registration's
	// (which pods are sent).
	AllowUnprefixedEnvFrom bool
	DeviceListStrategy     api.DeviceListStrategy
	UnprefixedEnvFrom      EnvFromRule
	Audit                  bool
}

// DefaultStartTimeout is how long the webhook may take to start serving
// before it gives up and exits (the kubelet then restarts it).
const DefaultStartTimeout = time.Minute

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
	// Everything before serving is bounded: a start that hangs (an API
	// request never answered) ends with an error naming the stage, and
	// the kubelet restarts the container, instead of a replica that is
	// never ready and logs nothing.
	startTimeout := o.StartTimeout
	if startTimeout <= 0 {
		startTimeout = DefaultStartTimeout
	}
	startCtx, cancelStart := context.WithTimeout(ctx, startTimeout)
	defer cancelStart()
	logger.Info("Webhook starting", "caSecret", o.CASecretNamespace+"/"+o.CASecretName, "startTimeout", startTimeout)
	var ca *CA
	var err error
	if o.CASecretName != "" {
		ca, err = LoadOrCreateCA(startCtx, o.Client, o.CASecretNamespace, o.CASecretName)
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
	// The informers stop when Run returns (Shutdown waits for them), on
	// an error too, not only when ctx ends.
	informerCtx, stopInformers := context.WithCancel(ctx)
	factory.Start(informerCtx.Done())
	defer factory.Shutdown()
	defer stopInformers()
	var unsynced []string
	for typ, ok := range factory.WaitForCacheSync(startCtx.Done()) {
		if !ok {
			unsynced = append(unsynced, fmt.Sprint(typ))
		}
	}
	if len(unsynced) > 0 {
		if ctx.Err() != nil {
			return nil
		}
		sort.Strings(unsynced)
		return fmt.Errorf("the informers of %s did not sync within %s (can the webhook's service account list and watch nodes and namespaces, and does the API server answer?)", strings.Join(unsynced, ", "), startTimeout)
	}

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: o.Client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	reg := prometheus.NewRegistry()
	findings, err := NewFindings(reg, broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "tessera-webhook"}))
	if err != nil {
		return err
	}
	adm := &Admission{
		Names: o.Names, SchedulerName: o.SchedulerName, LargestGPUMiB: inv.Largest, MIGShareMiB: inv.MIGShareMiB,
		SchedulerUsers: o.SchedulerUsers, Trusted: trust.trusted, AllowUnprefixedEnvFrom: o.AllowUnprefixedEnvFrom,
		DeviceListStrategy: o.DeviceListStrategy, UnprefixedEnvFrom: o.UnprefixedEnvFrom, Audit: o.Audit,
		Report: findings.Report, Claims: ClientClaims{Client: o.Client},
	}
	if o.Audit {
		logger.Info("Audit mode: isolation findings are admitted with warnings, events and metrics, not refused")
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", o.Listen, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", adm.Handler(logger))
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{
		Handler:           mux,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
	}
	errCh := make(chan error, 1)
	go func() { errCh <- srv.ServeTLS(ln, "", "") }()

	if o.Register {
		rg := o.Registration
		rg.CABundle = ca.CertPEM
		rg.Names = o.Names
		rg.SchedulerUsers = o.SchedulerUsers
		rg.DeviceListStrategy = o.DeviceListStrategy
		if rg.URL == "" && rg.ServiceName == "" {
			// No Service: the API server calls the listener directly.
			rg.URL = "https://" + ln.Addr().String()
		}
		if err := rg.Apply(startCtx, o.Client); err != nil {
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
