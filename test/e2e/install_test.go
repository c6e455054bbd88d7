//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tessera-gpu/tessera/internal/nodeagent/nodelabels"
	"github.com/tessera-gpu/tessera/internal/testenv"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// shBlocks are the sh code blocks of a Markdown file's section (from its
// heading to the next heading of level 2): each one's commands,
// continuation lines joined, comments dropped.
func shBlocks(t *testing.T, root, file, heading string) [][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("%s has no %q section", file, heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var blocks [][]string
	for {
		var block string
		if _, section, ok = strings.Cut(section, "```sh\n"); !ok {
			break
		}
		block, section, _ = strings.Cut(section, "```")
		var cmds []string
		cur := ""
		for _, line := range strings.Split(block, "\n") {
			if i := strings.Index(line, " #"); i >= 0 {
				line = line[:i]
			}
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if strings.HasSuffix(line, "\\") {
				cur += strings.TrimSuffix(line, "\\")
				continue
			}
			cmds = append(cmds, cur+line)
			cur = ""
		}
		if len(cmds) > 0 {
			blocks = append(blocks, cmds)
		}
	}
	if len(blocks) == 0 {
		t.Fatalf("%s's %q has no sh block", file, heading)
	}
	return blocks
}

// shBlock is the first sh code block of a section.
func shBlock(t *testing.T, root, file, heading string) []string {
	t.Helper()
	return shBlocks(t, root, file, heading)[0]
}

// shBlockWith is the sh code block of a section whose first command
// starts with prefix.
func shBlockWith(t *testing.T, root, file, heading, prefix string) []string {
	t.Helper()
	for _, b := range shBlocks(t, root, file, heading) {
		if strings.HasPrefix(b[0], prefix) {
			return b
		}
	}
	t.Fatalf("%s's %q has no sh block starting with %q", file, heading, prefix)
	return nil
}

// docInstall is the install as the docs tell a user on this node:
// docs/install.md's namespace commands (the API server enforces Pod
// Security baseline where a namespace sets none), then the README's
// "Install on a cluster": `make images`, which make e2e ran before the
// test; the push to a registry, which is the image tagged in containerd
// under the repository the README's helm install names; and that helm
// install, with the values docs/install.md gives for a node without
// NVIDIA's runtime whose driver NVIDIA's driver container installs.
func docInstall(t *testing.T, root string) (prepare []string, install, repository string) {
	t.Helper()
	prepare = shBlockWith(t, root, "docs/install.md", "## Installing", "kubectl create namespace")
	cmds := shBlock(t, root, "README.md", "## Install on a cluster")
	if len(cmds) != 2 || cmds[0] != "make images" {
		t.Fatalf("README.md's install block is not `make images` and helm install (what this test follows): %q", cmds)
	}
	install = cmds[1]
	if !strings.HasPrefix(install, "helm install ") || !strings.Contains(install, "--wait") || !strings.Contains(install, "--atomic") {
		t.Fatalf("README.md's install block does not end with helm install --wait --atomic: %q", cmds)
	}
	m := regexp.MustCompile(`--set image\.repository=(\S+)`).FindStringSubmatch(install)
	if m == nil {
		t.Fatalf("README.md's helm install names no image.repository: %q", install)
	}
	cdi := shBlockWith(t, root, "docs/install.md", "## Prerequisites", "helm install")
	values := regexp.MustCompile(`--set (\S+)`).FindAllStringSubmatch(cdi[0], -1)
	var set []string
	for _, v := range values {
		if strings.HasPrefix(v[1], "nodeAgent.driverRoot=") {
			// The documented value for NVIDIA's driver container.
			v[1] = "nodeAgent.driverRoot=" + driverRoot
		}
		set = append(set, "--set "+v[1])
	}
	if !slices.Contains(set, "--set nodeAgent.deviceListStrategy=cdi-cri") || !slices.Contains(set, "--set nodeAgent.driverRoot="+driverRoot) {
		t.Fatalf("docs/install.md's install without NVIDIA's runtime does not set the CDI strategy and the driver root: %q", cdi[0])
	}
	return prepare, install + " " + strings.Join(set, " "), m[1]
}

// mustFail runs a command line that must fail, and returns its output.
// While it runs, the cluster's state is sampled every 20 s: a failed
// install is rolled back before a check could read why it failed the way
// it did, so the last sample taken while it ran is kept for the check's
// message (lastState).
func (e *env) mustFail(t *testing.T, line string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	sampled := make(chan string, 1)
	stop := make(chan struct{})
	go func() {
		last := ""
		tick := time.NewTicker(20 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				sampled <- last
				return
			case <-tick.C:
				select {
				case <-stop: // the command ended: no new sample
					sampled <- last
					return
				default:
				}
				last = time.Now().UTC().Format(time.TimeOnly) + "\n" + e.clusterState()
			}
		}
	}()
	out, err := e.sh(ctx, line)
	close(stop)
	e.lastState = <-sampled
	if err == nil {
		t.Fatalf("%s: succeeded, want it refused:\n%s", line, out)
	}
	return out
}

// badInput: helm install (the README's) with each bad input fails with an
// error naming it, and leaves nothing of the release: no object of the
// chart, no pod, no webhook, nothing on the node.
func (e *env) badInput(t *testing.T, install string) {
	const quick = " --timeout 45s"

	// An API server older than the chart supports.
	proxy := e.versionProxy(t, "v1.35.4")
	out := e.mustFail(t, "KUBECONFIG="+proxy+" "+install)
	if !strings.Contains(out, "kubeVersion") || !strings.Contains(out, "v1.35.4") {
		t.Fatalf("an API server of Kubernetes 1.35: want helm to name the chart's kubeVersion and the server's version, got:\n%s", out)
	}
	t.Logf("unsupported API server: %s", strings.TrimSpace(out))
	e.checkNothingInstalled(t)

	// A wrong image tag: helm's wait ends at its timeout and the release is
	// rolled back; the kubelet's events, which outlive the rollback, name
	// the image (docs/install.md).
	out = e.mustFail(t, install+" --set image.tag=0.1.0-missing"+quick)
	e.checkNothingInstalled(t)
	ev := e.must(t, "kubectl get events -n tessera-system --field-selector type=Warning -o jsonpath='{range .items[*]}{.message}{\"\\n\"}{end}'")
	if !strings.Contains(ev, e.repository+":0.1.0-missing") {
		t.Fatalf("a wrong image tag: no Warning event names the image; helm said:\n%s\nevents:\n%s\nthe cluster while helm ran, at:\n%s", out, ev, e.lastState)
	}
	t.Logf("wrong image tag: %s; events: %s", strings.TrimSpace(out), firstLine(ev, "0.1.0-missing"))

	// No driver root on the node (NVIDIA's driver container not there):
	// the node agent cannot start; the chart's readiness check (its
	// post-install Job) fails, naming the cause, and helm rolls back.
	// Its own timeout is below helm's.
	// helm's --timeout applies to each wait: the Deployments' first, then
	// the hook's; the check's own timeout ends it well before. The
	// Deployments' wait gets room for a loaded machine (in one CI run they
	// took longer than 120 s to be ready, and helm failed before the hook
	// ran); the check's failure still ends the install at once.
	const check = " --timeout 300s --debug --set readinessCheck.timeout=30s"
	out, ev = e.refusedAtCheck(t, "a missing driver root", install+check, driverRoot, "TesseraNotReady",
		"helm to fail at the readiness check and its TesseraNotReady event to name "+driverRoot,
		func(out, ev string) bool {
			return strings.Contains(helmError(out), "wait-ready") && strings.Contains(ev, "tessera-node-agent") && strings.Contains(ev, driverRoot+" is not a directory")
		})
	t.Logf("missing driver root: %s; event: %s", lastLine(out), firstLine(ev, driverRoot))

	// No CDI spec of the GPUs: the agent's check at start fails.
	out, ev = e.refusedAtCheck(t, "a missing CDI spec", install+check, cdiSpec, "TesseraPrerequisite",
		"helm to fail at the readiness check and a TesseraPrerequisite event naming the GPUs and the CDI directories",
		func(out, ev string) bool {
			return strings.Contains(helmError(out), "wait-ready") && strings.Contains(ev, e.driver.GPUs[0].UUID) && strings.Contains(ev, "/var/run/cdi")
		})
	t.Logf("missing CDI spec: %s; event: %s", lastLine(out), firstLine(ev, "CDI"))
}

// refusedAtCheck runs the install line with path moved away (a
// prerequisite of the node agent missing on the node): helm must fail,
// nothing of the release may be left, and helm's output with the
// messages of this attempt's events of the reason must satisfy ok. An install that ran into
// helm's own deadline without reaching the readiness check (seen once in
// CI, 2026-11-28, cause not known: helm's --debug output and the cluster's
// state sampled while it ran say what it waited for) is retried once, the
// first attempt logged in full (RETRIED) so that it stays visible.
func (e *env) refusedAtCheck(t *testing.T, what, line, path, reason, want string, ok func(out, ev string) bool) (string, string) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		// Only this attempt's events count.
		e.must(t, "kubectl delete events -A --field-selector reason="+reason)
		out := func() string {
			if err := os.Rename(path, path+".away"); err != nil {
				t.Fatal(err)
			}
			// Put back even when mustFail ends the test.
			defer func() {
				if err := os.Rename(path+".away", path); err != nil {
					t.Error(err)
				}
			}()
			return e.mustFail(t, line)
		}()
		e.checkNothingInstalled(t)
		ev := e.must(t, "kubectl get events -A --field-selector reason="+reason+" -o jsonpath='{range .items[*]}{.message}{\"\\n\"}{end}'")
		if ok(out, ev) {
			return out, ev
		}
		if herr := helmError(out); attempt == 1 && !strings.Contains(herr, "wait-ready") && strings.Contains(herr, "context deadline exceeded") {
			t.Logf("RETRIED: %s: helm ran into its deadline before the readiness check answered; helm said:\n%s\nevents:\n%s\nthe cluster while helm ran, at:\n%s", what, out, ev, e.lastState)
			continue
		}
		t.Fatalf("%s: want %s; helm said:\n%s\nevents:\n%s\nthe cluster while helm ran, at:\n%s", what, want, out, ev, e.lastState)
	}
}

// helmError is helm's error in its output: from the line "Error: ..."
// to the end, or to its --debug trace.
func helmError(out string) string {
	out = "\n" + out
	i := strings.Index(out, "\nError: ")
	if i < 0 {
		return ""
	}
	rest := out[i+1:]
	if j := strings.Index(rest, "[debug]"); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// lastLine is helm's error line ("Error: ..."), or else the last
// non-empty line of s (with --debug helm prints its trace after the
// error).
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "Error:") {
			return lines[i]
		}
	}
	return lines[len(lines)-1]
}

func firstLine(s, containing string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, containing) {
			return l
		}
	}
	return ""
}

// checkNothingInstalled: no release, no object of the chart, no pod of
// the release's namespace, no webhook, nothing the agent writes on the
// node.
func (e *env) checkNothingInstalled(t *testing.T) {
	t.Helper()
	if out := e.must(t, "helm list -A -a -q"); strings.TrimSpace(out) != "" {
		t.Fatalf("helm still lists a release: %s", out)
	}
	ns := e.must(t, "kubectl get all,configmaps,secrets,serviceaccounts,roles,rolebindings,poddisruptionbudgets -n tessera-system -l app.kubernetes.io/instance=tessera -o name")
	cluster := e.must(t, "kubectl get clusterroles,clusterrolebindings,mutatingwebhookconfigurations,validatingwebhookconfigurations,validatingadmissionpolicies,validatingadmissionpolicybindings -l app.kubernetes.io/instance=tessera -o name")
	if strings.TrimSpace(ns+cluster) != "" {
		t.Fatalf("the chart's objects are left:\n%s%s", ns, cluster)
	}
	testenv.WaitFor(t, "no pod in tessera-system", 2*time.Minute, func() bool {
		l, err := e.cp.Client.CoreV1().Pods("tessera-system").List(context.Background(), metav1.ListOptions{})
		return err == nil && len(l.Items) == 0
	})
	e.checkNode(t)
}

// checkNode: the Node carries no label or annotation of Tessera's.
func (e *env) checkNode(t *testing.T) {
	t.Helper()
	n, err := e.cp.Client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range nodelabels.Managed {
		if v, ok := n.Labels[k]; ok {
			t.Errorf("node label %s=%s is left", k, v)
		}
	}
	for k := range n.Labels {
		if strings.HasPrefix(k, "tessera.io/") {
			t.Errorf("node label %s is left", k)
		}
	}
	for k := range n.Annotations {
		if strings.HasPrefix(k, "tessera.io/") {
			t.Errorf("node annotation %s is left", k)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// versionProxy serves the API server with /version answering version, as
// an older cluster would; it returns a kubeconfig for it.
func (e *env) versionProxy(t *testing.T, version string) string {
	cfg, err := clientcmd.LoadFromFile(e.cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	target, _ := url.Parse(e.cp.APIServer)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cfg.Clusters[cfg.Contexts[cfg.CurrentContext].Cluster].CertificateAuthorityData)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	cert, err := tls.LoadX509KeyPair(e.cp.PKI.File("apiserver.crt"), e.cp.PKI.File("apiserver.key"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	minor := strings.Split(strings.TrimPrefix(version, "v"), ".")[1]
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/version" {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"major":"1","minor":%q,"gitVersion":%q,"platform":"linux/amd64"}`, minor, version)
			return
		}
		rp.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	cl := cfg.Clusters[cfg.Contexts[cfg.CurrentContext].Cluster]
	cl.Server = "https://" + l.Addr().(*net.TCPAddr).String()
	path := filepath.Join(sandbox.Dir, "old-apiserver.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// Host paths the chart's node agent writes (values' nodeAgent.hostPaths
// and the DRA plugin's directory).
var hostPaths = []string{"/var/lib/tessera", "/usr/local/tessera", "/run/tessera", "/var/lib/kubelet/plugins/gpu.tessera.io"}

// uninstall runs docs/install.md's "Uninstalling" and checks that nothing
// of Tessera's is left: no object in the API (its name, labels or
// annotations), no node label or annotation, no host file, no device
// plugin registered with the kubelet.
func (e *env) uninstall(t *testing.T) {
	for _, p := range hostPaths[:3] {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("before uninstalling, %s should exist (the agent's): %v", p, err)
		}
	}
	for _, c := range shBlock(t, e.root, "docs/install.md", "## Uninstalling") {
		t.Logf("$ %s", c)
		t.Log(e.must(t, c))
	}
	e.checkNothingInstalled(t)
	// Every object of every resource the API server serves.
	cfg, err := clientcmd.BuildConfigFromFlags("", e.cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dc := discovery.NewDiscoveryClientForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)
	lists, err := discovery.ServerPreferredResources(dc)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, l := range lists {
		gv, _ := schema.ParseGroupVersion(l.GroupVersion)
		for _, r := range l.APIResources {
			if r.Name == "events" || !strings.Contains(strings.Join(r.Verbs, ","), "list") {
				continue
			}
			objs, err := dyn.Resource(gv.WithResource(r.Name)).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				if apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err) {
					continue
				}
				t.Fatalf("listing %s: %v", r.Name, err)
			}
			for _, o := range objs.Items {
				hit := strings.Contains(o.GetName(), "tessera") || strings.Contains(o.GetNamespace(), "tessera")
				for k, v := range o.GetLabels() {
					hit = hit || strings.Contains(k, "tessera") || strings.Contains(v, "tessera")
				}
				for k := range o.GetAnnotations() {
					hit = hit || strings.HasPrefix(k, "tessera.io/")
				}
				if hit {
					left = append(left, r.Name+" "+o.GetNamespace()+"/"+o.GetName())
				}
			}
		}
	}
	if len(left) > 0 {
		t.Fatalf("Tessera's objects are left after the clean-up: %s", strings.Join(left, ", "))
	}
	for _, p := range hostPaths {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("host path %s is left", p)
		}
	}
	ents, err := os.ReadDir("/var/lib/kubelet/device-plugins")
	if err != nil {
		t.Fatal(err)
	}
	for _, ent := range ents {
		if n := ent.Name(); n != "kubelet.sock" && n != "kubelet_internal_checkpoint" && n != "DEPRECATION" {
			t.Errorf("a device plugin is still registered with the kubelet: %s", n)
		}
	}
	// The kubelet reports the plugins' resources gone with its next node
	// status (every 10 s by default).
	prefix := api.DefaultResourceNames.GPU[:strings.Index(api.DefaultResourceNames.GPU, "/")] + "/"
	var offered []string
	testenv.WaitFor(t, "the node offering no GPU resource", time.Minute, func() bool {
		n, err := e.cp.Client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		offered = offered[:0]
		for r, q := range n.Status.Allocatable {
			if strings.HasPrefix(string(r), prefix) && !q.IsZero() {
				offered = append(offered, string(r)+"="+q.String())
			}
		}
		return len(offered) == 0
	})
}
