package hollowkubelet

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/sets"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	apitest "k8s.io/cri-api/pkg/apis/testing"
	fakeremote "k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/hollowkubelet/cinit"
	"github.com/tessera-gpu/tessera/internal/version"
)

// Container is a container of the runtime: the pod it belongs to, what
// the kubelet put in it (among them what the device plugin's Allocate
// returned), the devices the kubelet allocated to it and, once it runs,
// its process.
type Container struct {
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	PodUID    string `json:"podUID"`
	Name      string `json:"name"`
	Image     string `json:"image,omitempty"`
	// Command is what runs: the container's command and arguments, the
	// runtime's default command when it names neither, or the stand-in
	// for its image's program (RuntimeOptions.StandIn).
	Command []string `json:"command,omitempty"`
	// StandIn: a stand-in runs in place of the image's program
	// (RuntimeOptions.StandIn).
	StandIn bool `json:"standIn,omitempty"`
	// StandsInFor is the container's own command and arguments when a
	// stand-in runs in their place (none when the container names
	// neither and would run its image's entrypoint).
	StandsInFor []string          `json:"standsInFor,omitempty"`
	WorkingDir  string            `json:"workingDir,omitempty"`
	Env         map[string]string `json:"env"`
	Mounts      []Mount           `json:"mounts,omitempty"`
	// Devices are the devices the kubelet allocated to the container,
	// per resource (its device manager's view, from the pod-resources
	// API).
	Devices []Devices `json:"devices,omitempty"`
	// CDIDevices are the CDI devices the kubelet asked for (a DRA
	// driver's); their environment and mounts are in Env and Mounts.
	CDIDevices []string `json:"cdiDevices,omitempty"`
	// Hooks are the OCI hooks of its CDI devices.
	Hooks []Hook `json:"hooks,omitempty"`
	// GPUs are the GPUs the runtime exposed to the container (Prepare).
	GPUs []GPU `json:"gpus,omitempty"`
	// LogPath is the container's log file (CRI format).
	LogPath string `json:"logPath,omitempty"`
	// PID is the host PID of the container's first process (PID 1 in
	// the container) while it runs; 0 when containers are not run.
	PID int `json:"pid,omitempty"`
	// ExitCode is set once the container has exited.
	ExitCode *int32    `json:"exitCode,omitempty"`
	Created  time.Time `json:"created"`
	Started  time.Time `json:"started,omitzero"`
	Finished time.Time `json:"finished,omitzero"`
}

// Mount is one bind mount of a container.
type Mount struct {
	HostPath      string `json:"hostPath"`
	ContainerPath string `json:"containerPath"`
	ReadOnly      bool   `json:"readOnly,omitempty"`
}

// Devices are the device IDs the kubelet allocated to a container for
// one resource.
type Devices struct {
	Resource string   `json:"resource"`
	IDs      []string `json:"ids"`
}

// GPU is a GPU exposed to a container: its UUID and its index on the
// node.
type GPU struct {
	UUID  string `json:"uuid"`
	Index int    `json:"index"`
}

// InitNames returns the names of a pod's init containers that run to
// completion (not sidecars).
type InitNames func(ctx context.Context, namespace, pod, uid string) (sets.Set[string], error)

// RuntimeOptions configure the container runtime.
type RuntimeOptions struct {
	// Init is the tessera-lab-init binary. With it every container runs
	// as a process; without it containers are only recorded: init
	// containers end successfully as soon as they start (InitNames says
	// which they are) and the others run until stopped.
	Init string
	// RunDir holds a scratch directory per running container.
	RunDir string
	// Hide are host paths containers must not see.
	Hide []string
	// DefaultCommand runs in a container that names neither a command
	// nor arguments (the lab's images have no entrypoint).
	DefaultCommand []string
	// DefaultEnv is every container's environment under the kubelet's
	// (an image's ENV): PATH, HOME.
	DefaultEnv map[string]string
	// StandIn, if set, is asked for each container what runs in place of
	// its command (argv: its command and arguments) because its image's
	// program is not on the host; nil: the command runs.
	StandIn func(image string, argv []string, env map[string]string) []string
	// Prepare, if set, sees each container and its spec before it
	// starts and may add mounts, environment and GPUs (the lab's GPU
	// driver).
	Prepare func(*Container, *cinit.Spec) error
	// InitNames tells init containers apart when containers are only
	// recorded.
	InitNames InitNames
	// CDIDirs are where the node's CDI specs are (a container's CDI
	// devices are resolved there, ResolveCDI).
	CDIDirs []string
	// Cgroups, if set, puts each running container's processes in a
	// cgroup named after its pod and container (cgroup.go).
	Cgroups *Cgroups
	// PodResources is the kubelet's pod-resources socket, from which the
	// containers' Devices are read (none when empty).
	PodResources string
	// OnCreate sees every container the runtime is asked to create;
	// OnUpdate sees it again when it starts and when it exits; OnRemove
	// when it is removed.
	OnCreate, OnUpdate, OnRemove func(Container)
	Logger                       klog.Logger
}

// Runtime is the emulated nodes' container runtime: the CRI runtime and
// image services of k8s.io/cri-client's fake (which keeps the pods'
// sandboxes and containers and "pulls" every image at once) with the
// container lifecycle replaced: each container runs its command as a
// process of its own (RuntimeOptions.Init), its output in its log file,
// its exit code in its status.
type Runtime struct {
	*fakeremote.RemoteRuntime
	opts    RuntimeOptions
	devices *podDevices

	mu    sync.Mutex
	byID  map[string]*container
	procs sync.WaitGroup
}

// container is the runtime's state of one container beyond the fake's.
type container struct {
	rec     Container
	spec    cinit.Spec
	sandbox string
	logDir  string
	proc    *process // nil until started, and when not running processes
}

// NewRuntime returns a runtime; Serve it on an endpoint.
func NewRuntime(o RuntimeOptions) *Runtime {
	r := &Runtime{RemoteRuntime: fakeremote.NewFakeRemoteRuntime(), opts: o, byID: map[string]*container{}}
	if o.PodResources != "" {
		r.devices = &podDevices{socket: o.PodResources}
	}
	// The kubelet's image client refuses an image without a size; the
	// lab's images are the host's programs and take no room.
	r.ImageService.SetFakeImageSize(1)
	r.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true}, {Type: runtimeapi.NetworkReady, Status: true},
	}}
	return r
}

// Serve serves the CRI runtime and image services on endpoint (a unix
// socket, "unix:///path") until ctx ends, then stops every container.
func (r *Runtime) Serve(ctx context.Context, endpoint string) error {
	l, err := util.CreateListener(endpoint)
	if err != nil {
		return fmt.Errorf("container runtime: listening on %s: %w", endpoint, err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, r)
	runtimeapi.RegisterImageServiceServer(srv, r)
	go r.trimCalls(ctx)
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	err = srv.Serve(l)
	r.stopAll()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// trimCalls empties the fake's call log now and then: it keeps every call
// forever otherwise.
func (r *Runtime) trimCalls(ctx context.Context) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.RuntimeService.Lock()
			r.RuntimeService.Called = nil
			r.RuntimeService.Unlock()
		}
	}
}

func (r *Runtime) logger() klog.Logger { return r.opts.Logger }

// Version names the runtime.
func (r *Runtime) Version(ctx context.Context, req *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	v, err := r.RemoteRuntime.Version(ctx, req)
	if err != nil {
		return nil, err
	}
	v.RuntimeName, v.RuntimeVersion = "tessera-lab", version.Version
	if r.opts.Init == "" {
		v.RuntimeName = "tessera-lab-recorder"
	}
	return v, nil
}

// CreateContainer records the container; the process starts in
// StartContainer.
func (r *Runtime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	cfg, sb := req.GetConfig(), req.GetSandboxConfig()
	if err := unsupported(cfg); err != nil {
		return nil, err
	}
	fakeID, err := r.RuntimeService.CreateContainer(ctx, req.PodSandboxId, cfg, sb)
	if err != nil {
		return nil, err
	}
	id := r.renameContainer(fakeID)
	c := &container{sandbox: req.PodSandboxId, logDir: sb.GetLogDirectory()}
	c.rec = Container{
		ID: id, Namespace: sb.GetMetadata().GetNamespace(), Pod: sb.GetMetadata().GetName(), PodUID: sb.GetMetadata().GetUid(),
		Name: cfg.GetMetadata().GetName(), Image: cfg.GetImage().GetImage(), WorkingDir: cfg.WorkingDir,
		Env: map[string]string{}, Created: time.Now(),
	}
	if cfg.LogPath != "" && sb.GetLogDirectory() != "" {
		c.rec.LogPath = filepath.Join(sb.GetLogDirectory(), cfg.LogPath)
	}
	for k, v := range r.opts.DefaultEnv {
		c.rec.Env[k] = v
	}
	if sb.GetHostname() != "" {
		c.rec.Env["HOSTNAME"] = sb.GetHostname()
	}
	for _, e := range cfg.Envs {
		c.rec.Env[e.Key] = string(e.Value)
	}
	for _, m := range cfg.Mounts {
		c.rec.Mounts = append(c.rec.Mounts, Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, ReadOnly: m.Readonly})
	}
	for _, d := range cfg.Devices {
		c.rec.Mounts = append(c.rec.Mounts, Mount{HostPath: d.HostPath, ContainerPath: d.ContainerPath, ReadOnly: !strings.Contains(d.Permissions, "w")})
	}
	if err := r.applyCDI(&c.rec, cfg); err != nil {
		_ = r.RuntimeService.RemoveContainer(ctx, id)
		return nil, err
	}
	// An image of the lab has no entrypoint: the command and its
	// arguments run as given, arguments alone run as the command, and a
	// container naming neither runs the default.
	c.rec.Command = append(append([]string(nil), cfg.Command...), cfg.Args...)
	if r.opts.StandIn != nil {
		if s := r.opts.StandIn(c.rec.Image, c.rec.Command, c.rec.Env); s != nil {
			c.rec.StandIn, c.rec.StandsInFor, c.rec.Command = true, c.rec.Command, s
		}
	}
	if len(c.rec.Command) == 0 {
		c.rec.Command = append([]string(nil), r.opts.DefaultCommand...)
	}
	if r.devices != nil {
		var err error
		if c.rec.Devices, err = r.devices.of(ctx, c.rec.Namespace, c.rec.Pod, c.rec.Name); err != nil {
			r.logger().Error(err, "Reading the container's devices from the kubelet; recorded without them", "pod", c.rec.Namespace+"/"+c.rec.Pod, "container", c.rec.Name)
		}
	}
	c.spec = r.specOf(&c.rec, cfg, sb)
	r.RuntimeService.Lock()
	if fc, ok := r.RuntimeService.Containers[id]; ok {
		fc.LogPath = c.rec.LogPath
		fc.Mounts = append(fc.Mounts, cfg.Mounts...)
	}
	r.RuntimeService.Unlock()
	r.mu.Lock()
	r.byID[id] = c
	rec := c.rec
	r.mu.Unlock()
	if r.opts.OnCreate != nil {
		r.opts.OnCreate(rec)
	}
	return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
}

// renameContainer gives the fake's new container an ID as containerd and
// CRI-O make them (the fake names it <sandbox>_<name>_<attempt>), which
// its cgroup's name carries (cgroup.go), and returns it.
func (r *Runtime) renameContainer(fakeID string) string {
	id := newContainerID()
	r.RuntimeService.Lock()
	defer r.RuntimeService.Unlock()
	if fc, ok := r.RuntimeService.Containers[fakeID]; ok {
		delete(r.RuntimeService.Containers, fakeID)
		fc.Id = id
		r.RuntimeService.Containers[id] = fc
	}
	return id
}

// applyCDI resolves the container's CDI devices and applies their edits,
// as containerd and CRI-O do; a device no spec defines fails the
// container.
func (r *Runtime) applyCDI(c *Container, cfg *runtimeapi.ContainerConfig) error {
	for _, d := range cfg.CDIDevices {
		c.CDIDevices = append(c.CDIDevices, d.Name)
	}
	if len(c.CDIDevices) == 0 {
		return nil
	}
	edits, err := ResolveCDI(r.opts.CDIDirs, c.CDIDevices)
	if err != nil {
		return status.Errorf(codes.FailedPrecondition, "container %s: %v", c.Name, err)
	}
	maps.Copy(c.Env, edits.Env)
	c.Mounts = append(c.Mounts, edits.Mounts...)
	c.Hooks = append(c.Hooks, edits.Hooks...)
	return nil
}

// unsupported refuses what the runtime cannot do rather than ignore it.
func unsupported(cfg *runtimeapi.ContainerConfig) error {
	for _, m := range cfg.Mounts {
		if m.Image != nil {
			return status.Errorf(codes.Unimplemented, "mount %s: image volumes are not supported by the lab's runtime", m.ContainerPath)
		}
	}
	if cfg.Tty || cfg.Stdin {
		return status.Errorf(codes.Unimplemented, "container %s: tty and stdin are not supported by the lab's runtime", cfg.GetMetadata().GetName())
	}
	return nil
}

// specOf is how the container's process starts.
func (r *Runtime) specOf(c *Container, cfg *runtimeapi.ContainerConfig, sb *runtimeapi.PodSandboxConfig) cinit.Spec {
	s := cinit.Spec{
		Hide: r.opts.Hide, Hostname: sb.GetHostname(), Cwd: c.WorkingDir, Argv: c.Command,
	}
	sc := cfg.GetLinux().GetSecurityContext()
	if u := sc.GetRunAsUser(); u != nil {
		s.UID, s.GID = uint32(u.Value), uint32(u.Value)
	}
	if g := sc.GetRunAsGroup(); g != nil {
		s.GID = uint32(g.Value)
	}
	for _, g := range sc.GetSupplementalGroups() {
		s.Groups = append(s.Groups, uint32(g))
	}
	s.ReadOnlyRoot = sc.GetReadonlyRootfs()
	for _, m := range c.Mounts {
		s.Mounts = append(s.Mounts, cinit.Mount{Source: m.HostPath, Target: m.ContainerPath, ReadOnly: m.ReadOnly})
	}
	kubeletHome := false
	for _, e := range cfg.Envs {
		kubeletHome = kubeletHome || e.Key == "HOME"
	}
	if s.UID != 0 && !kubeletHome {
		c.Env["HOME"] = "/" // the image's HOME is root's; another user gets "/", as from runc
	}
	return s
}

// StartContainer starts the container's process.
func (r *Runtime) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	id := req.ContainerId
	r.mu.Lock()
	c, ok := r.byID[id]
	r.mu.Unlock()
	if !ok {
		return nil, status.Errorf(codes.NotFound, "container %s not found", id)
	}
	if r.opts.Init == "" {
		if _, err := r.RemoteRuntime.StartContainer(ctx, req); err != nil {
			return nil, err
		}
		r.endInitContainer(ctx, c)
		return &runtimeapi.StartContainerResponse{}, nil
	}
	if err := r.start(c); err != nil {
		now := time.Now()
		r.setState(id, func(fc *apitest.FakeContainer) {
			fc.State, fc.StartedAt, fc.FinishedAt = runtimeapi.ContainerState_CONTAINER_EXITED, now.UnixNano(), now.UnixNano()
			fc.ExitCode, fc.Reason, fc.Message = 128, "StartError", err.Error()
		})
		r.updated(c, func(rec *Container) {
			code := int32(128)
			rec.ExitCode, rec.Finished = &code, now
		})
		return nil, status.Error(codes.Unknown, err.Error())
	}
	return &runtimeapi.StartContainerResponse{}, nil
}

// endInitContainer makes an init container (not a sidecar) exit
// successfully once started, when containers are only recorded.
func (r *Runtime) endInitContainer(ctx context.Context, c *container) {
	if r.opts.InitNames == nil {
		return
	}
	inits, err := r.opts.InitNames(ctx, c.rec.Namespace, c.rec.Pod, c.rec.PodUID)
	if err != nil || !inits.Has(c.rec.Name) {
		return
	}
	r.setState(c.rec.ID, func(fc *apitest.FakeContainer) {
		fc.State, fc.FinishedAt, fc.ExitCode, fc.Reason = runtimeapi.ContainerState_CONTAINER_EXITED, time.Now().UnixNano(), 0, "Completed"
	})
}

// setState changes the fake's record of a container.
func (r *Runtime) setState(id string, f func(*apitest.FakeContainer)) {
	r.RuntimeService.Lock()
	defer r.RuntimeService.Unlock()
	if fc, ok := r.RuntimeService.Containers[id]; ok {
		f(fc)
	}
}

// updated applies f to the container's record and reports it.
func (r *Runtime) updated(c *container, f func(*Container)) {
	r.mu.Lock()
	f(&c.rec)
	rec := c.rec
	r.mu.Unlock()
	if r.opts.OnUpdate != nil {
		r.opts.OnUpdate(rec)
	}
}

// StopContainer stops the container's process: SIGTERM, then SIGKILL
// after the grace period (timeout seconds), as a container runtime does.
func (r *Runtime) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	r.mu.Lock()
	c, ok := r.byID[req.ContainerId]
	r.mu.Unlock()
	if !ok || c.proc == nil {
		if _, err := r.RemoteRuntime.StopContainer(ctx, req); err != nil {
			return nil, err
		}
		return &runtimeapi.StopContainerResponse{}, nil
	}
	c.proc.stop(time.Duration(req.Timeout) * time.Second)
	return &runtimeapi.StopContainerResponse{}, nil
}

// RemoveContainer stops the container if it still runs and removes it
// with its log and scratch directory.
func (r *Runtime) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	r.mu.Lock()
	c, ok := r.byID[req.ContainerId]
	delete(r.byID, req.ContainerId)
	r.mu.Unlock()
	if ok {
		r.remove(c)
	}
	if _, err := r.RemoteRuntime.RemoveContainer(ctx, req); err != nil {
		return nil, err
	}
	return &runtimeapi.RemoveContainerResponse{}, nil
}

func (r *Runtime) remove(c *container) {
	if c.proc != nil {
		c.proc.stop(0)
		_ = os.RemoveAll(c.proc.scratch)
	}
	if c.rec.LogPath != "" {
		_ = os.Remove(c.rec.LogPath)
		_ = os.Remove(filepath.Dir(c.rec.LogPath)) // the container's directory, once empty
	}
	if r.opts.OnRemove != nil {
		r.opts.OnRemove(c.rec)
	}
}

// inSandbox lists the sandbox's containers.
func (r *Runtime) inSandbox(sandbox string) []*container {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*container
	for _, c := range r.byID {
		if c.sandbox == sandbox {
			out = append(out, c)
		}
	}
	return out
}

// StopPodSandbox kills the containers still running in the sandbox.
func (r *Runtime) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	for _, c := range r.inSandbox(req.PodSandboxId) {
		if c.proc != nil {
			c.proc.stop(0)
		}
	}
	return r.RemoteRuntime.StopPodSandbox(ctx, req)
}

// RemovePodSandbox removes the sandbox's containers and its log
// directory.
func (r *Runtime) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	logDir := ""
	for _, c := range r.inSandbox(req.PodSandboxId) {
		r.mu.Lock()
		delete(r.byID, c.rec.ID)
		r.mu.Unlock()
		r.remove(c)
		logDir = c.logDir
		r.RuntimeService.Lock()
		delete(r.RuntimeService.Containers, c.rec.ID)
		r.RuntimeService.Unlock()
	}
	if logDir != "" {
		_ = os.RemoveAll(logDir)
	}
	return r.RemoteRuntime.RemovePodSandbox(ctx, req)
}

// ReopenContainerLog reopens the log after the kubelet rotated it.
func (r *Runtime) ReopenContainerLog(ctx context.Context, req *runtimeapi.ReopenContainerLogRequest) (*runtimeapi.ReopenContainerLogResponse, error) {
	r.mu.Lock()
	c, ok := r.byID[req.ContainerId]
	r.mu.Unlock()
	if !ok {
		return nil, status.Errorf(codes.NotFound, "container %s not found", req.ContainerId)
	}
	if c.proc != nil && c.proc.log != nil {
		if err := c.proc.log.reopen(); err != nil {
			return nil, err
		}
	}
	return &runtimeapi.ReopenContainerLogResponse{}, nil
}

var errNoExec = errors.New("the lab's container runtime does not support exec, attach or port-forward (kubectl exec, attach, port-forward)")

func (r *Runtime) ExecSync(context.Context, *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	return nil, status.Error(codes.Unimplemented, errNoExec.Error())
}

func (r *Runtime) Exec(context.Context, *runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error) {
	return nil, status.Error(codes.Unimplemented, errNoExec.Error())
}

func (r *Runtime) Attach(context.Context, *runtimeapi.AttachRequest) (*runtimeapi.AttachResponse, error) {
	return nil, status.Error(codes.Unimplemented, errNoExec.Error())
}

func (r *Runtime) PortForward(context.Context, *runtimeapi.PortForwardRequest) (*runtimeapi.PortForwardResponse, error) {
	return nil, status.Error(codes.Unimplemented, errNoExec.Error())
}

// Containers returns the runtime's containers, sorted by ID.
func (r *Runtime) Containers() []Container {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Container, 0, len(r.byID))
	for _, c := range r.byID {
		out = append(out, c.rec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// stopAll kills every container (the runtime is going away) and waits
// for them.
func (r *Runtime) stopAll() {
	r.mu.Lock()
	var all []*container
	for _, c := range r.byID {
		all = append(all, c)
	}
	r.mu.Unlock()
	for _, c := range all {
		if c.proc != nil {
			c.proc.stop(0)
		}
	}
	r.procs.Wait()
}
