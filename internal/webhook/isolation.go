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

// injectionErrors refuses what would override what the node agent gives
// every container of a GPU pod: environment variables that select its
// devices, load code before the limiter or set a limit (api.ReservedEnv),
// envFrom sources whose keys could be such variables, and volumes mounted
// on the paths where the agent mounts the limiter, its preload list, the
// limits file and the state directory. The kubelet puts a pod's own
// variables after the device plugin's, so the pod's would win. No
// opt-out: nothing legitimate needs them.
func (p *Admission) injectionErrors(pod *corev1.Pod) field.ErrorList {
	var errs field.ErrorList
	for _, ref := range allContainers(pod) {
		c := ref.c
		for j, e := range c.Env {
			if api.ReservedEnv(e.Name) {
				errs = append(errs, field.Forbidden(ref.path.Child("env").Index(j).Child("name"),
					fmt.Sprintf("%s is set by the Tessera node agent (it selects the container's GPUs, loads code ahead of the GPU limiter, or sets a limit); a GPU pod may not set it", e.Name)))
			}
		}
		for j, src := range c.EnvFrom {
			errs = append(errs, p.envFromErrors(ref.path.Child("envFrom").Index(j), src)...)
		}
		for j, m := range c.VolumeMounts {
			if hit, ok := reservedMount(m.MountPath); ok {
				errs = append(errs, field.Forbidden(ref.path.Child("volumeMounts").Index(j).Child("mountPath"),
					fmt.Sprintf("%q is on or under %s, where the Tessera node agent mounts the GPU limiter's files", m.MountPath, hit)))
			}
		}
		for j, d := range c.VolumeDevices {
			if hit, ok := reservedMount(d.DevicePath); ok {
				errs = append(errs, field.Forbidden(ref.path.Child("volumeDevices").Index(j).Child("devicePath"),
					fmt.Sprintf("%q is on or under %s, where the Tessera node agent mounts the GPU limiter's files", d.DevicePath, hit)))
			}
		}
	}
	return errs
}

func (p *Admission) envFromErrors(at *field.Path, src corev1.EnvFromSource) field.ErrorList {
	what := "an envFrom source"
	switch {
	case src.ConfigMapRef != nil:
		what = fmt.Sprintf("ConfigMap %q", src.ConfigMapRef.Name)
	case src.SecretRef != nil:
		what = fmt.Sprintf("Secret %q", src.SecretRef.Name)
	}
	if src.Prefix == "" {
		if p.AllowUnprefixedEnvFrom {
			return nil
		}
		return field.ErrorList{field.Forbidden(at,
			fmt.Sprintf("%s without a prefix could set NVIDIA_VISIBLE_DEVICES or the GPU limiter's variables, which admission cannot see (the keys live in the object and may change); give it a prefix, e.g. prefix: APP_ (the cluster administrator can allow unprefixed envFrom where devices are selected by CDI: docs/security.md)", what))}
	}
	if api.EnvPrefixReaches(src.Prefix) {
		return field.ErrorList{field.Forbidden(at.Child("prefix"),
			fmt.Sprintf("%q can make %s set a variable the Tessera node agent sets (NVIDIA_*, CUDA_DEVICE_*, CUDA_MPS_*, LD_*, TESSERA_*); choose a prefix outside them", src.Prefix, what))}
	}
	return nil
}

// reservedMount reports the container path of the node agent's that p is
// on or under.
func reservedMount(p string) (string, bool) {
	c := path.Clean("/" + p)
	for _, q := range api.ContainerReservedPaths() {
		if c == q || under(c, q) {
			return q, true
		}
	}
	return "", false
}
