package webhook

// What a GPU pod may not do: settings under which its GPU share cannot be
// enforced (isolationErrors, with a namespace or cluster opt-out for
// trusted workloads), and settings that collide with what the node agent
// puts into its containers (injectionErrors, never allowed).

import (
	"fmt"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// TrustedLabel on a Namespace (value "true") opts its pods out of the
// isolation checks. Only cluster administrators can label namespaces.
const TrustedLabel = "tessera.io/trusted-workloads"

// DefaultProtectedHostPaths are host paths through which a container can
// reach GPUs or defeat the limiter: device nodes, the proc and sys trees,
// the kubelet's device-plugin and pod-resources sockets, Tessera's own
// state and library, the NVIDIA runtime's configuration and the CDI
// specifications. A GPU pod may mount none of them, nothing below them and
// no directory above them.
var DefaultProtectedHostPaths = []string{
	"/dev", "/proc", "/sys",
	"/var/lib/kubelet", "/var/lib/tessera", "/usr/local/tessera",
	"/etc/nvidia-container-runtime", "/etc/cdi", "/var/run/cdi", "/run/cdi",
	"/run/nvidia", "/var/run/nvidia",
}

// dangerousCapabilities let a container leave its isolation: mount, load
// modules, reach raw devices or memory, trace other processes, read
// files by handle, create device nodes, or load BPF programs.
var dangerousCapabilities = []string{
	"ALL", "SYS_ADMIN", "SYS_MODULE", "SYS_RAWIO", "SYS_PTRACE", "DAC_READ_SEARCH", "MKNOD", "BPF", "PERFMON",
}

// allContainers is every container of the pod with its path, ephemeral
// containers included.
func allContainers(pod *corev1.Pod) []containerRef {
	out := containers(pod)
	spec := field.NewPath("spec")
	for i := range pod.Spec.EphemeralContainers {
		c := corev1.Container(pod.Spec.EphemeralContainers[i].EphemeralContainerCommon)
		out = append(out, containerRef{&c, spec.Child("ephemeralContainers").Index(i)})
	}
	return out
}

func (p *Admission) trusted(ns string) bool { return p.Trusted != nil && p.Trusted(ns) }

// isolationErrors refuses the settings under which a GPU pod could reach
// other tenants' GPUs or processes, or tamper with the limiter: host PID
// or IPC namespaces, privileged containers, capabilities that leave the
// container, an unmasked /proc, and host paths over devices, the driver
// or Tessera's files. A namespace labelled TrustedLabel=true (or named
// with --trusted-namespaces) is exempt.
func (p *Admission) isolationErrors(pod *corev1.Pod) field.ErrorList {
	if p.trusted(pod.Namespace) {
		return nil
	}
	optOut := fmt.Sprintf("(a cluster administrator can exempt trusted workloads: label the namespace %s=true)", TrustedLabel)
	var errs field.ErrorList
	spec := field.NewPath("spec")
	if pod.Spec.HostPID {
		errs = append(errs, field.Forbidden(spec.Child("hostPID"), "a GPU pod in the host's PID namespace can see and signal every process on the node, other tenants' GPU processes included "+optOut))
	}
	if pod.Spec.HostIPC {
		errs = append(errs, field.Forbidden(spec.Child("hostIPC"), "a GPU pod in the host's IPC namespace shares memory with other tenants' processes and the MPS daemon "+optOut))
	}
	protected := p.ProtectedHostPaths
	if protected == nil {
		protected = DefaultProtectedHostPaths
	}
	for i, v := range pod.Spec.Volumes {
		if v.HostPath == nil {
			continue
		}
		if hit, ok := overlaps(v.HostPath.Path, protected); ok {
			errs = append(errs, field.Forbidden(spec.Child("volumes").Index(i).Child("hostPath", "path"),
				fmt.Sprintf("%q overlaps %s on the host, through which a container reaches GPUs or the limiter's files %s", v.HostPath.Path, hit, optOut)))
		}
	}
	for _, ref := range allContainers(pod) {
		sc := ref.c.SecurityContext
		if sc == nil {
			continue
		}
		scPath := ref.path.Child("securityContext")
		if sc.Privileged != nil && *sc.Privileged {
			errs = append(errs, field.Forbidden(scPath.Child("privileged"),
				"a privileged container sees every GPU of the node, so its GPU share cannot be enforced; drop privileged or the GPU resources "+optOut))
		}
		if sc.Capabilities != nil {
			for j, c := range sc.Capabilities.Add {
				name := strings.TrimPrefix(strings.ToUpper(string(c)), "CAP_")
				if slices.Contains(dangerousCapabilities, name) {
					errs = append(errs, field.Forbidden(scPath.Child("capabilities", "add").Index(j),
						fmt.Sprintf("%s lets a container leave its isolation (mounts, devices, other processes), so its GPU share cannot be enforced %s", c, optOut)))
				}
			}
		}
		if sc.ProcMount != nil && *sc.ProcMount == corev1.UnmaskedProcMount {
			errs = append(errs, field.Forbidden(scPath.Child("procMount"), "an unmasked /proc exposes the host's kernel interfaces "+optOut))
		}
	}
	return errs
}

// overlaps reports the first protected path that p equals, lies under or
// lies above. Paths are compared cleaned, component by component.
func overlaps(p string, protected []string) (string, bool) {
	c := path.Clean("/" + p)
	for _, q := range protected {
		q = path.Clean(q)
		if c == q || under(c, q) || under(q, c) {
			return q, true
		}
	}
	return "", false
}

// under reports whether a lies strictly below directory b.
func under(a, b string) bool {
	if b == "/" {
		return a != "/"
	}
	return strings.HasPrefix(a, b+"/")
}

// envSelects reports whether a pod's environment selects devices on the
// cluster's nodes (api.DeviceListStrategy.EnvSelectsDevices).
func (p *Admission) envSelects() bool { return p.DeviceListStrategy.EnvSelectsDevices() }

// EnvFromRule says when a GPU pod may import variables through envFrom
// without a prefix (or with one that can form a device-selecting name).
type EnvFromRule string

const (
	// EnvFromAuto (the default, also ""): allowed where the pod's
	// environment selects no device (DeviceListStrategy cdi-cri or
	// volume-mounts), refused under envvar.
	EnvFromAuto EnvFromRule = "auto"
	// EnvFromAllow: always allowed (the administrator vouches that the
	// runtime ignores the environment of unprivileged containers).
	EnvFromAllow EnvFromRule = "allow"
	// EnvFromRefuse: always refused.
	EnvFromRefuse EnvFromRule = "refuse"
)

// EnvFromRules are the rules, the default first.
func EnvFromRules() []EnvFromRule { return []EnvFromRule{EnvFromAuto, EnvFromAllow, EnvFromRefuse} }

// envFromAllowed reports whether a GPU pod's envFrom whose keys could
// select devices is admitted.
func (p *Admission) envFromAllowed() bool {
	switch {
	case p.AllowUnprefixedEnvFrom || p.UnprefixedEnvFrom == EnvFromAllow:
		return true
	case p.UnprefixedEnvFrom == EnvFromRefuse:
		return false
	}
	return !p.envSelects()
}

// injectionErrors refuses, in every container of a pod that holds GPUs
// (init and ephemeral containers too), what takes effect before the
// container's own code runs or what the node agent's mounts rely on; the
// container could set anything else itself once it runs:
//   - the variables that select devices (api.DeviceSelectionEnv), where
//     the node's runtime reads them (envvar): the kubelet puts a pod's own
//     variables after the device plugin's, so the pod's value would win;
//   - envFrom whose keys could be such a variable (keys of a ConfigMap or
//     Secret are invisible to admission and may change later), unless
//     envFromAllowed;
//   - volumes mounted on, under or above the paths where the agent mounts
//     the limiter, its preload list, the limits file and the state
//     directory (a volume above one would hide it where the runtime does
//     not mount in depth order).
//
// No namespace opt-out: nothing legitimate needs them.
func (p *Admission) injectionErrors(pod *corev1.Pod) field.ErrorList {
	var errs field.ErrorList
	for _, ref := range allContainers(pod) {
		c := ref.c
		if p.envSelects() {
			for j, e := range c.Env {
				if api.SelectsDevices(e.Name) {
					errs = append(errs, field.Forbidden(ref.path.Child("env").Index(j).Child("name"),
						fmt.Sprintf("%s selects the container's GPUs before its code runs (the NVIDIA container runtime reads it on this cluster, whose node agents pass devices with --device-list-strategy=envvar) and would win over the GPUs the Tessera node agent assigns; a GPU pod may not set it", e.Name)))
				}
			}
		}
		if !p.envFromAllowed() {
			for j, src := range c.EnvFrom {
				if err := envFromError(ref.path.Child("envFrom").Index(j), src); err != nil {
					errs = append(errs, err)
				}
			}
		}
		for j, m := range c.VolumeMounts {
			if err := mountError(ref.path.Child("volumeMounts").Index(j).Child("mountPath"), m.MountPath); err != nil {
				errs = append(errs, err)
			}
		}
		for j, d := range c.VolumeDevices {
			if err := mountError(ref.path.Child("volumeDevices").Index(j).Child("devicePath"), d.DevicePath); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if v, ok := pod.Annotations[api.AnnotationPreload]; ok {
		if _, err := api.ParsePreloads(v); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("metadata", "annotations").Key(api.AnnotationPreload), v, err.Error()))
		}
	}
	return errs
}

// envFromWhat names an envFrom source.
func envFromWhat(src corev1.EnvFromSource) string {
	switch {
	case src.ConfigMapRef != nil:
		return fmt.Sprintf("ConfigMap %q", src.ConfigMapRef.Name)
	case src.SecretRef != nil:
		return fmt.Sprintf("Secret %q", src.SecretRef.Name)
	}
	return "an envFrom source"
}

// envFromError refuses an envFrom source whose keys could select devices.
func envFromError(at *field.Path, src corev1.EnvFromSource) *field.Error {
	if !api.EnvPrefixSelectsDevices(src.Prefix) {
		return nil
	}
	what := envFromWhat(src)
	if src.Prefix == "" {
		return field.Forbidden(at,
			fmt.Sprintf("%s without a prefix could set NVIDIA_VISIBLE_DEVICES, which selects the container's GPUs on this cluster (node agents with --device-list-strategy=envvar), and admission cannot see its keys (they live in the object and may change); give it a prefix, e.g. prefix: APP_, or have the administrator pass devices by CDI or volume mounts (docs/security.md)", what))
	}
	return field.Forbidden(at.Child("prefix"),
		fmt.Sprintf("%q can make %s set %s, which selects the container's GPUs on this cluster (node agents with --device-list-strategy=envvar); choose a prefix that cannot form %s", src.Prefix, what, strings.Join(api.DeviceSelectionEnv(), ", "), strings.Join(api.DeviceSelectionEnv(), " or ")))
}

// mountError refuses a container path on, under or above one where the
// node agent mounts the limiter's files.
func mountError(at *field.Path, p string) *field.Error {
	c := path.Clean("/" + p)
	for _, q := range api.ContainerReservedPaths() {
		switch {
		case c == q || under(c, q):
			return field.Forbidden(at, fmt.Sprintf("%q is on or under %s, where the Tessera node agent mounts the GPU limiter's files", p, q))
		case under(q, c):
			return field.Forbidden(at, fmt.Sprintf("%q is above %s, where the Tessera node agent mounts the GPU limiter's files: a volume there can hide them (mount the volume at a path that is not an ancestor of %s, e.g. a directory of its own)", p, q, strings.Join(api.ContainerReservedPaths(), ", ")))
		}
	}
	return nil
}

// deviceEnvFindings are what a pod that holds no GPU may not do where its
// environment selects devices: set a device-selecting variable to
// anything but api.EnvVoidDevices, or import one through envFrom without
// NVIDIA_VISIBLE_DEVICES set to void in env (env wins over envFrom, so
// the mutation's void holds; voidDeviceEnv writes it). On a GPU node
// whose runtime reads the environment such a container would get GPUs
// with no share, no limiter and no record. A trusted namespace
// (monitoring, the GPU operator) is exempt.
func (p *Admission) deviceEnvFindings(pod *corev1.Pod) field.ErrorList {
	if !p.envSelects() || p.trusted(pod.Namespace) {
		return nil
	}
	optOut := fmt.Sprintf("(a cluster administrator can exempt trusted workloads: label the namespace %s=true)", TrustedLabel)
	var errs field.ErrorList
	for _, ref := range allContainers(pod) {
		voided := false
		for j, e := range ref.c.Env {
			if !api.SelectsDevices(e.Name) {
				continue
			}
			if e.Name == api.EnvVisibleDevices && e.Value == api.EnvVoidDevices && e.ValueFrom == nil {
				voided = true
				continue
			}
			errs = append(errs, field.Forbidden(ref.path.Child("env").Index(j).Child("name"),
				fmt.Sprintf("%s selects GPUs before the container's code runs (the NVIDIA container runtime reads it on this cluster) and this pod asks for no GPU: on a GPU node its container would get GPUs outside any share; remove it, or ask for GPUs %s", e.Name, optOut)))
		}
		if voided {
			continue
		}
		for j, src := range ref.c.EnvFrom {
			if api.EnvPrefixSelectsDevices(src.Prefix) {
				errs = append(errs, field.Forbidden(ref.path.Child("envFrom").Index(j),
					fmt.Sprintf("%s could set %s (its keys are invisible to admission) and this pod asks for no GPU; set %s=%s in the container's env (the webhook's mutation does) or give the source a prefix %s", envFromWhat(src), api.EnvVisibleDevices, api.EnvVisibleDevices, api.EnvVoidDevices, optOut)))
				break
			}
		}
	}
	return errs
}

// voidDeviceEnv sets NVIDIA_VISIBLE_DEVICES=void in every container of a
// pod that holds no GPU and imports variables through envFrom that could
// set it (where the environment selects devices, outside trusted
// namespaces): a variable in env wins over one from envFrom, and void
// makes the NVIDIA runtime mount no GPU. It returns a warning per
// container changed.
func (p *Admission) voidDeviceEnv(pod *corev1.Pod) []string {
	if !p.envSelects() || p.trusted(pod.Namespace) {
		return nil
	}
	var warnings []string
	for _, ref := range containers(pod) {
		c := ref.c
		reaches := ""
		for _, src := range c.EnvFrom {
			if api.EnvPrefixSelectsDevices(src.Prefix) {
				reaches = envFromWhat(src)
				break
			}
		}
		if reaches == "" {
			continue
		}
		set := false
		for _, e := range c.Env {
			set = set || api.SelectsDevices(e.Name)
		}
		if set {
			continue // refused by deviceEnvFindings, or already void
		}
		c.Env = append(c.Env, corev1.EnvVar{Name: api.EnvVisibleDevices, Value: api.EnvVoidDevices})
		warnings = append(warnings, fmt.Sprintf("tessera: %s: added env %s=%s: %s could set %s, which selects GPUs on this cluster's nodes, and the pod asks for no GPU", ref.path, api.EnvVisibleDevices, api.EnvVoidDevices, reaches, api.EnvVisibleDevices))
	}
	return warnings
}
