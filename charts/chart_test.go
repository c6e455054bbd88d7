// Package charts tests the Helm chart charts/tessera with helm itself
// (built from the module pinned in hack/tools): lint, golden renders,
// the values schema, and that the chart and deploy/ do not drift.
package charts

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/internal/webhook"
	"github.com/tessera-gpu/tessera/pkg/api"
)

var update = flag.Bool("update", false, "rewrite the golden renders in testdata/")

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// helm runs the pinned helm with args and returns its output.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	helmOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tessera-helm")
		if err != nil {
			helmErr = err
			return
		}
		helmPath, helmErr = testenv.BuildHelm(dir)
	})
	if helmErr != nil {
		t.Fatal(helmErr)
	}
	cmd := exec.Command(helmPath, args...)
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if err != nil {
		return out.String() + errOut.String(), fmt.Errorf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errOut.String())
	}
	return out.String(), nil
}

// valueSets are the golden renders: the defaults and two other sets.
var valueSets = map[string]string{
	"default":                "",
	"certmanager-monitoring": "testdata/values-certmanager-monitoring.yaml",
	"custom":                 "testdata/values-custom.yaml",
}

func render(t *testing.T, values string, extra ...string) string {
	t.Helper()
	args := []string{"template", "tessera", "./tessera", "--namespace", "tessera-system"}
	if values != "" {
		args = append(args, "-f", values)
	}
	out, err := helm(t, append(args, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestChartLint(t *testing.T) {
	for name, values := range valueSets {
		args := []string{"lint", "--strict", "./tessera"}
		if values != "" {
			args = append(args, "-f", values)
		}
		if out, err := helm(t, args...); err != nil {
			t.Errorf("%s: %v", name, err)
		} else if !strings.Contains(out, "0 chart(s) failed") {
			t.Errorf("%s: helm lint: %s", name, out)
		}
	}
}

func TestChartGolden(t *testing.T) {
	for name, values := range valueSets {
		t.Run(name, func(t *testing.T) {
			got := render(t, values)
			path := filepath.Join("testdata", name+".golden.yaml")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (go test ./charts -update writes it)", err)
			}
			if got != string(want) {
				t.Errorf("helm template with %s differs from %s (go test ./charts -update rewrites it after review)", name, path)
			}
		})
	}
}

// TestChartSchemaRejects: values.schema.json refuses bad values with a
// message naming the field.
func TestChartSchemaRejects(t *testing.T) {
	for _, tc := range []struct{ set, want string }{
		{"scheduler.replicas=0", "replicas"},
		{"webhook.certificates.mode=vault", "mode"},
		{"nodeAgent.metricsPort=70000", "metricsPort"},
		{"nodeAgent.hostPaths.state=relative/path", "state"},
		{"nodeAgent.recoveryPeriod=soon", "recoveryPeriod"},
		{"resourcePrefix=Not_A_Domain", "resourcePrefix"},
		{"schedulerReplicas=2", "schedulerReplicas"},
		{"monitoring.prometheusRule.memoryLimitRatio=2", "memoryLimitRatio"},
		{"image.tag=0.1.0:latest", "tag"},
		{"image.tag=v 1", "tag"},
		{"image.repository=ghcr.io/Tessera/tessera", "repository"},
		{"image.repository=ghcr.io/tessera:0.1.0", "repository"},
		{"nodeAgent.driverRoot=run/nvidia/driver", "driverRoot"},
		{"nodeAgent.cdiSpecDirs={etc/cdi}", "cdiSpecDirs"},
		{"nodeAgent.deviceListStrategy=cdi", "deviceListStrategy"},
		{"webhook.unprefixedEnvFrom=sometimes", "unprefixedEnvFrom"},
		{"webhook.audit=maybe", "audit"},
		{"nodeAgent.deviceListStrategy=auto", "deviceListStrategy"},
		{"readinessCheck.timeout=4 minutes", "timeout"},
		{"readinessCheck.enabled=yes", "enabled"},
		{"nodeAgent.driverMemoryLimits=off", "driverMemoryLimits"},
		{"nodeAgent.driverMemoryLimits=true", "driverMemoryLimits"},
	} {
		out, err := helm(t, "template", "tessera", "./tessera", "--set", tc.set)
		if err == nil {
			t.Errorf("--set %s accepted", tc.set)
			continue
		}
		if !strings.Contains(out, tc.want) {
			t.Errorf("--set %s: the error does not name %s:\n%s", tc.set, tc.want, out)
		}
	}
	if out, err := helm(t, "template", "tessera", "./tessera", "--set", "nodeAgent.profiles.default=null"); err == nil || !strings.Contains(out, "default") {
		t.Errorf("profiles without default accepted: %v %s", err, out)
	}
}

// objects splits a multi-document render into objects by "Kind/name".
func objects(t *testing.T, docs string) map[string]*unstructured.Unstructured {
	t.Helper()
	out := map[string]*unstructured.Unstructured{}
	r := utilyaml.NewYAMLReader(bufioReader(docs))
	for {
		b, err := r.Read()
		if err != nil {
			break
		}
		var m map[string]any
		if err := yaml.Unmarshal(b, &m); err != nil {
			t.Fatalf("%v\n%s", err, b)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		out[u.GetKind()+"/"+u.GetName()] = u
	}
	return out
}

func readDeploy(t *testing.T) map[string]*unstructured.Unstructured {
	t.Helper()
	var all strings.Builder
	for _, f := range []string{"../deploy/scheduler/scheduler.yaml", "../deploy/scheduler/webhook.yaml", "../deploy/node-agent/node-agent.yaml", "../deploy/node-agent/configmap.yaml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all.WriteString("\n---\n")
		all.Write(b)
	}
	return objects(t, all.String())
}

// subset reports the first path where want is not contained in got (maps:
// every key of want with a contained value; lists: same length, element
// by element; scalars: equal).
func subset(want, got any, path string) string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return path + ": not an object in the chart"
		}
		for k, v := range w {
			if d := subset(v, g[k], path+"."+k); d != "" {
				return d
			}
		}
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Sprintf("%s: %d elements in deploy/, %v in the chart", path, len(w), got)
		}
		for i := range w {
			if d := subset(w[i], g[i], fmt.Sprintf("%s[%d]", path, i)); d != "" {
				return d
			}
		}
	default:
		if fmt.Sprint(want) != fmt.Sprint(got) {
			return fmt.Sprintf("%s: deploy/ has %v, the chart %v", path, want, got)
		}
	}
	return ""
}

// TestChartMatchesDeploy keeps deploy/ and the chart from drifting: every
// object of deploy/ (but the Namespace, which Helm's --create-namespace
// makes) is in the default render of release "tessera" in tessera-system,
// with every field deploy/ sets set to the same value (the chart may add:
// labels, security contexts, flags with their default values); the
// scheduler configuration is the same file; deploy/monitoring's
// PrometheusRule is the chart's.
func TestChartMatchesDeploy(t *testing.T) {
	chart := objects(t, render(t, ""))
	for key, d := range readDeploy(t) {
		if d.GetKind() == "Namespace" {
			continue
		}
		c, ok := chart[key]
		if !ok {
			t.Errorf("%s is in deploy/ but not in the chart", key)
			continue
		}
		dm := d.DeepCopy().Object
		unstructured.RemoveNestedField(dm, "metadata", "labels")
		unstructured.RemoveNestedField(dm, "metadata", "annotations")
		unstructured.RemoveNestedField(dm, "spec", "template", "metadata", "labels")
		for _, path := range [][]string{{"spec", "template", "spec", "containers"}, {"spec", "template", "spec", "initContainers"}} {
			cs, found, _ := unstructured.NestedSlice(dm, path...)
			if !found {
				continue
			}
			for _, x := range cs {
				delete(x.(map[string]any), "image")
				delete(x.(map[string]any), "args") // compared below
			}
			_ = unstructured.SetNestedSlice(dm, cs, path...)
		}
		if key == "ClusterRole/tessera-webhook" {
			// The chart narrows the webhook's rights to its own
			// configurations (resourceNames, no create): compared below.
			unstructured.RemoveNestedField(dm, "rules")
		}
		if diff := subset(dm, c.Object, key); diff != "" {
			t.Errorf("drift: %s", diff)
		}
		// Container args: deploy/'s are a subset of the chart's.
		dcs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
		ccs, _, _ := unstructured.NestedSlice(c.Object, "spec", "template", "spec", "containers")
		for i := range dcs {
			da, _, _ := unstructured.NestedStringSlice(dcs[i].(map[string]any), "args")
			ca, _, _ := unstructured.NestedStringSlice(ccs[i].(map[string]any), "args")
			have := map[string]bool{}
			for _, a := range ca {
				have[a] = true
			}
			for _, a := range da {
				if !have[a] {
					t.Errorf("drift: %s container %d: deploy/ passes %q, the chart does not (chart args %q)", key, i, a, ca)
				}
			}
		}
	}
	// The webhook's RBAC in the chart is within deploy/'s.
	dr, _, _ := unstructured.NestedSlice(readDeploy(t)["ClusterRole/tessera-webhook"].Object, "rules")
	cr, _, _ := unstructured.NestedSlice(chart["ClusterRole/tessera-webhook"].Object, "rules")
	allowed := map[string]bool{}
	for _, t3 := range ruleTuples(dr) {
		allowed[t3] = true
	}
	for _, t3 := range ruleTuples(cr) {
		if !allowed[t3] {
			t.Errorf("drift: the chart's webhook may %s, deploy/'s may not", t3)
		}
	}

	a, err := os.ReadFile("../deploy/scheduler/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("tessera/files/scheduler-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("drift: charts/tessera/files/scheduler-config.yaml differs from deploy/scheduler/config.yaml (copy it)")
	}
	a, err = os.ReadFile("../deploy/admission/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, err = os.ReadFile("tessera/files/admission-policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("drift: charts/tessera/files/admission-policy.yaml differs from deploy/admission/policy.yaml (copy it)")
	}
	// The release "tessera" in tessera-system renders deploy/'s policy.
	for _, key := range []string{"ValidatingAdmissionPolicy/tessera-allocation-records", "ValidatingAdmissionPolicyBinding/tessera-allocation-records",
		"ValidatingAdmissionPolicy/tessera-gpu-inventories", "ValidatingAdmissionPolicyBinding/tessera-gpu-inventories"} {
		if chart[key] == nil {
			t.Errorf("%s is in deploy/admission but not in the chart", key)
		}
	}

	rule := objects(t, render(t, "", "--set", "monitoring.prometheusRule.enabled=true"))["PrometheusRule/tessera-node-agent"]
	shipped, err := os.ReadFile("../deploy/monitoring/prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	d := objects(t, string(shipped))["PrometheusRule/tessera-node-agent"]
	if d == nil || rule == nil || !reflect.DeepEqual(d.Object["spec"], rule.Object["spec"]) {
		t.Error("drift: deploy/monitoring/prometheusrule.yaml's rules differ from the chart's (helm template --set monitoring.prometheusRule.enabled=true -s templates/monitoring.yaml)")
	}
}

// TestChartWebhookArgs: the webhook's flags follow the values: the node
// agents' device-list strategy (whether a pod's environment selects
// devices), the envFrom rule, audit mode.
func TestChartWebhookArgs(t *testing.T) {
	args := func(extra ...string) []string {
		d := objects(t, render(t, "", extra...))["Deployment/tessera-webhook"]
		cs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
		a, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
		return a
	}
	has := func(a []string, want string) bool {
		for _, x := range a {
			if x == want {
				return true
			}
		}
		return false
	}
	def := args()
	for _, want := range []string{"--device-list-strategy=envvar", "--unprefixed-env-from=auto"} {
		if !has(def, want) {
			t.Errorf("default args %q lack %s", def, want)
		}
	}
	if has(def, "--audit") {
		t.Error("audit mode by default")
	}
	set := args("--set", "nodeAgent.deviceListStrategy=cdi-cri", "--set", "webhook.unprefixedEnvFrom=refuse", "--set", "webhook.audit=true")
	for _, want := range []string{"--device-list-strategy=cdi-cri", "--unprefixed-env-from=refuse", "--audit"} {
		if !has(set, want) {
			t.Errorf("args %q lack %s", set, want)
		}
	}
}

func ruleTuples(rules []any) []string {
	var out []string
	for _, r := range rules {
		m := r.(map[string]any)
		groups, _, _ := unstructured.NestedStringSlice(m, "apiGroups")
		res, _, _ := unstructured.NestedStringSlice(m, "resources")
		verbs, _, _ := unstructured.NestedStringSlice(m, "verbs")
		for _, g := range groups {
			for _, x := range res {
				for _, v := range verbs {
					out = append(out, g+"/"+x+":"+v)
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// TestChartWebhookConfigurations: the configurations the chart owns are
// the ones the webhook writes (internal/webhook.Registration), caBundle
// aside, for the default and another resource prefix; otherwise the
// webhook and `helm upgrade` would rewrite each other's.
func TestChartWebhookConfigurations(t *testing.T) {
	for _, tc := range []struct {
		prefix   string
		strategy api.DeviceListStrategy
	}{{"nvidia.com", api.DeviceListEnvvar}, {"example.com", api.DeviceListEnvvar}, {"nvidia.com", api.DeviceListCDI}} {
		prefix := tc.prefix
		chart := objects(t, render(t, "", "--set", "resourcePrefix="+prefix, "--set", "webhook.excludeNamespaces={batch}", "--set", "nodeAgent.deviceListStrategy="+string(tc.strategy)))
		names, err := api.NewResourceNames(prefix)
		if err != nil {
			t.Fatal(err)
		}
		reg := webhook.Registration{Name: "tessera-webhook", ServiceNamespace: "tessera-system", ServiceName: "tessera-webhook",
			ServicePort: 443, Names: names, ExcludeNamespaces: []string{"tessera-system", "batch"}, DeviceListStrategy: tc.strategy}
		m, v := reg.Configurations()
		var gotM admissionregistrationv1.MutatingWebhookConfiguration
		var gotV admissionregistrationv1.ValidatingWebhookConfiguration
		for obj, into := range map[string]any{"MutatingWebhookConfiguration/tessera-webhook": &gotM, "ValidatingWebhookConfiguration/tessera-webhook": &gotV} {
			u := chart[obj]
			if u == nil {
				t.Fatalf("%s not rendered", obj)
			}
			b, _ := yaml.Marshal(u.Object)
			if err := yaml.UnmarshalStrict(b, into); err != nil {
				t.Fatal(err)
			}
		}
		if !reflect.DeepEqual(gotM.Webhooks, m.Webhooks) {
			a, _ := yaml.Marshal(gotM.Webhooks)
			b, _ := yaml.Marshal(m.Webhooks)
			t.Errorf("prefix %s: the chart's mutating webhook differs from the webhook's:\n--- chart\n%s--- webhook\n%s", prefix, a, b)
		}
		if !reflect.DeepEqual(gotV.Webhooks, v.Webhooks) {
			a, _ := yaml.Marshal(gotV.Webhooks)
			b, _ := yaml.Marshal(v.Webhooks)
			t.Errorf("prefix %s: the chart's validating webhook differs from the webhook's:\n--- chart\n%s--- webhook\n%s", prefix, a, b)
		}
	}
}

// TestChartKubeVersion: Chart.yaml's kubeVersion admits the API servers
// the scheduler supports, from the minor of go.mod's k8s.io/kubernetes
// (kube-scheduler must not be newer than the API server; the scheduler
// checks the same at start, internal/preflight), and helm refuses older
// ones with a message naming the requirement.
func TestChartKubeVersion(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "k8s.io/kubernetes").Output()
	if err != nil {
		t.Fatal(err)
	}
	var major, minor int
	if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "v%d.%d.", &major, &minor); err != nil {
		t.Fatalf("go.mod's k8s.io/kubernetes %q: %v", out, err)
	}
	var chart struct{ KubeVersion string }
	b, err := os.ReadFile("tessera/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf(">=%d.%d.0-0", major, minor); chart.KubeVersion != want {
		t.Errorf("Chart.yaml kubeVersion %q, want %q (the scheduler is kube-scheduler %d.%d)", chart.KubeVersion, want, major, minor)
	}
	for _, v := range []string{fmt.Sprintf("v%d.%d.0", major, minor), fmt.Sprintf("v%d.%d.4-gke.100", major, minor), fmt.Sprintf("v%d.%d.1", major, minor+1)} {
		if _, err := helm(t, "template", "tessera", "./tessera", "--kube-version", v); err != nil {
			t.Errorf("Kubernetes %s refused: %v", v, err)
		}
	}
	for _, v := range []string{fmt.Sprintf("v%d.%d.9", major, minor-1), "v1.30.0"} {
		out, err := helm(t, "template", "tessera", "./tessera", "--kube-version", v)
		if err == nil || !strings.Contains(out, "kubeVersion") || !strings.Contains(out, chart.KubeVersion) {
			t.Errorf("Kubernetes %s: %v\n%s", v, err, out)
		}
	}
}

// containers returns a workload's containers (init containers first) by
// name.
func containers(t *testing.T, u *unstructured.Unstructured) map[string]map[string]any {
	t.Helper()
	if u == nil {
		t.Fatal("object not rendered")
	}
	out := map[string]map[string]any{}
	for _, f := range []string{"initContainers", "containers"} {
		cs, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", f)
		for _, c := range cs {
			m := c.(map[string]any)
			out[m["name"].(string)] = m
		}
	}
	return out
}

// TestChartImage: the default image is what `make images` builds
// (repository ghcr.io/tessera-gpu/tessera, tag the appVersion), for every
// container, in the chart and in deploy/; a digest renders as @sha256.
func TestChartImage(t *testing.T) {
	var chart struct{ AppVersion string }
	b, err := os.ReadFile("tessera/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &chart); err != nil || chart.AppVersion == "" {
		t.Fatalf("Chart.yaml appVersion: %v", err)
	}
	want := "ghcr.io/tessera-gpu/tessera:" + chart.AppVersion
	n := 0
	for src, objs := range map[string]map[string]*unstructured.Unstructured{"chart": objects(t, render(t, "")), "deploy/": readDeploy(t)} {
		for key, u := range objs {
			for name, c := range containers(t, u) {
				if c["image"] != want {
					t.Errorf("%s %s container %s: image %v, want %s", src, key, name, c["image"], want)
				}
				n++
			}
		}
	}
	if n < 8 {
		t.Errorf("only %d containers checked", n)
	}
	digest := "sha256:" + strings.Repeat("ab", 32)
	for _, c := range containers(t, objects(t, render(t, "", "--set", "image.tag="+digest))["Deployment/tessera-webhook"]) {
		if c["image"] != "ghcr.io/tessera-gpu/tessera@"+digest {
			t.Errorf("digest: image %v", c["image"])
		}
	}
}

// TestChartNodeWithoutNVIDIARuntime: with nodeAgent.driverRoot the agent
// gets the host's driver root read-only and loads NVML from it, without
// the NVIDIA runtime's variables; with cdi-cri it checks the CDI spec
// directories, mounted read-only. The defaults keep NVIDIA's runtime.
func TestChartNodeWithoutNVIDIARuntime(t *testing.T) {
	agent := func(values string, extra ...string) (map[string]any, map[string]any) {
		ds := objects(t, render(t, values, extra...))["DaemonSet/tessera-node-agent"]
		vols, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
		byName := map[string]any{}
		for _, v := range vols {
			byName[v.(map[string]any)["name"].(string)] = v
		}
		return containers(t, ds)["node-agent"], byName
	}
	argsOf := func(c map[string]any) string {
		a, _, _ := unstructured.NestedStringSlice(c, "args")
		return strings.Join(a, " ")
	}
	c, vols := agent("")
	if a := argsOf(c); strings.Contains(a, "--driver-root") || strings.Contains(a, "--cdi-spec-dirs") {
		t.Errorf("default args: %s", a)
	}
	if env := fmt.Sprint(c["env"]); !strings.Contains(env, "NVIDIA_VISIBLE_DEVICES") {
		t.Errorf("default: no NVIDIA_VISIBLE_DEVICES for NVIDIA's runtime: %s", env)
	}
	if vols["driver-root"] != nil {
		t.Error("default: a driver-root volume")
	}

	c, vols = agent("testdata/values-custom.yaml")
	a := argsOf(c)
	for _, want := range []string{"--driver-root=/driver-root", "--device-list-strategy=cdi-cri", "--cdi-spec-dirs=/etc/cdi,/var/run/cdi,/opt/cdi"} {
		if !strings.Contains(a, want) {
			t.Errorf("args lack %s: %s", want, a)
		}
	}
	if env := fmt.Sprint(c["env"]); strings.Contains(env, "NVIDIA_VISIBLE_DEVICES") {
		t.Errorf("driver root set, yet NVIDIA_VISIBLE_DEVICES: %s", env)
	}
	if p, _, _ := unstructured.NestedString(vols["driver-root"].(map[string]any), "hostPath", "path"); p != "/run/nvidia/driver" {
		t.Errorf("driver-root volume: %v", vols["driver-root"])
	}
	mounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
	got := map[string]map[string]any{}
	for _, m := range mounts {
		got[m.(map[string]any)["mountPath"].(string)] = m.(map[string]any)
	}
	for _, p := range []string{"/driver-root", "/etc/cdi", "/opt/cdi"} {
		if m := got[p]; m == nil || m["readOnly"] != true {
			t.Errorf("mount %s: %v, want read-only", p, m)
		}
	}
	if got["/driver-root"]["mountPropagation"] != "HostToContainer" {
		t.Errorf("driver root mount: %v", got["/driver-root"])
	}
	if got["/var/run/cdi"] == nil {
		t.Error("/var/run/cdi not mounted")
	}
}

// TestChartDriverMemoryLimits: with nodeAgent.driverMemoryLimits auto
// (the default) the init container installs tessera-hook beside the
// limiter on the host, the agent runs it (--memory-limits-hook, that host
// path, mounted at the same path) and writes its CDI specs to the host's
// /var/run/cdi, mounted writable; disabled renders neither flag; under
// cdi-cri the runtime must read /var/run/cdi, else the render fails
// naming the values.
func TestChartDriverMemoryLimits(t *testing.T) {
	type pod struct {
		init, agent []string
		mounts      map[string]map[string]map[string]any // container → mountPath → mount
		vols        map[string]map[string]any
	}
	agentPod := func(values string, extra ...string) pod {
		ds := objects(t, render(t, values, extra...))["DaemonSet/tessera-node-agent"]
		cs := containers(t, ds)
		p := pod{mounts: map[string]map[string]map[string]any{}, vols: map[string]map[string]any{}}
		p.init, _, _ = unstructured.NestedStringSlice(cs["install-limiter"], "args")
		p.agent, _, _ = unstructured.NestedStringSlice(cs["node-agent"], "args")
		for name, c := range cs {
			ms, _, _ := unstructured.NestedSlice(c, "volumeMounts")
			p.mounts[name] = map[string]map[string]any{}
			for _, m := range ms {
				p.mounts[name][m.(map[string]any)["mountPath"].(string)] = m.(map[string]any)
			}
		}
		vols, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
		for _, v := range vols {
			p.vols[v.(map[string]any)["name"].(string)] = v.(map[string]any)
		}
		return p
	}
	hostPath := func(p pod, container, mountPath string) string {
		m := p.mounts[container][mountPath]
		if m == nil {
			return ""
		}
		if m["readOnly"] == true {
			return "read-only " + fmt.Sprint(m["name"])
		}
		path, _, _ := unstructured.NestedString(p.vols[m["name"].(string)], "hostPath", "path")
		return path
	}
	for _, tc := range []struct {
		name, values string
		extra        []string
		limiter      string // hostPaths.limiter
	}{
		{"default", "", nil, "/usr/local/tessera"},
		{"custom", "testdata/values-custom.yaml", nil, "/opt/tessera"},
		{"explicit auto", "", []string{"--set", "nodeAgent.driverMemoryLimits=auto"}, "/usr/local/tessera"},
	} {
		p := agentPod(tc.values, tc.extra...)
		if !slices.Contains(p.init, "--hook-to=/host/usr/local/tessera/tessera-hook") {
			t.Errorf("%s: install-limiter args %q lack --hook-to", tc.name, p.init)
		}
		if got := hostPath(p, "install-limiter", "/host/usr/local/tessera"); got != tc.limiter {
			t.Errorf("%s: install-limiter's /host/usr/local/tessera is host %q, want %s", tc.name, got, tc.limiter)
		}
		if want := "--memory-limits-hook=" + tc.limiter + "/tessera-hook"; !slices.Contains(p.agent, want) {
			t.Errorf("%s: node-agent args %q lack %s", tc.name, p.agent, want)
		}
		if got := hostPath(p, "node-agent", tc.limiter); got != tc.limiter {
			t.Errorf("%s: the agent's %s is host %q, want the same path", tc.name, tc.limiter, got)
		}
		if got := hostPath(p, "node-agent", "/var/run/cdi"); got != "/var/run/cdi" {
			t.Errorf("%s: the agent's /var/run/cdi is %q, want the host's, writable", tc.name, got)
		}
		for _, a := range p.agent {
			if strings.HasPrefix(a, "--cdi-dir=") && a != "--cdi-dir=/var/run/cdi" {
				t.Errorf("%s: %s, want the default /var/run/cdi (mounted)", tc.name, a)
			}
		}
	}
	p := agentPod("", "--set", "nodeAgent.driverMemoryLimits=disabled")
	for _, a := range append(p.init, p.agent...) {
		if strings.Contains(a, "hook") {
			t.Errorf("disabled: %s", a)
		}
	}
	out, err := helm(t, "template", "tessera", "./tessera", "--set", "nodeAgent.deviceListStrategy=cdi-cri", "--set", "nodeAgent.cdiSpecDirs={/etc/cdi}")
	if err == nil || !strings.Contains(out, "nodeAgent.driverMemoryLimits=auto") || !strings.Contains(out, "nodeAgent.cdiSpecDirs [/etc/cdi]") || !strings.Contains(out, "/var/run/cdi") {
		t.Errorf("cdi-cri without /var/run/cdi: %v\n%s", err, out)
	}
	if _, err := helm(t, "template", "tessera", "./tessera", "--set", "nodeAgent.deviceListStrategy=cdi-cri", "--set", "nodeAgent.cdiSpecDirs={/etc/cdi}", "--set", "nodeAgent.driverMemoryLimits=disabled"); err != nil {
		t.Errorf("cdi-cri without /var/run/cdi, driver limits disabled: %v", err)
	}
}

func bufioReader(s string) *bufio.Reader { return bufio.NewReader(strings.NewReader(s)) }
