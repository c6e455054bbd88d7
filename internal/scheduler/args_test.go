package scheduler

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/placement"
	"github.com/tessera-gpu/tessera/internal/policies"
	"github.com/tessera-gpu/tessera/internal/scheduler/config"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// shippedConfigWithArgs writes deploy/scheduler/config.yaml with the
// Tessera plugin's args replaced by args (a YAML mapping) and returns its
// path. The kubeconfig points at nothing: loading the configuration and
// building the plugins never calls the API server.
func shippedConfigWithArgs(t *testing.T, args map[string]any) string {
	t.Helper()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	raw, err := deploy.SchedulerConfigFor(kubeconfig, 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, prof := range cfg["profiles"].([]any) {
		for _, pc := range prof.(map[string]any)["pluginConfig"].([]any) {
			if pc := pc.(map[string]any); pc["name"] == Name {
				pc["args"] = args
				found = true
			}
		}
	}
	if !found {
		t.Fatal("the shipped configuration has no Tessera pluginConfig")
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// loadArgs loads the file with kube-scheduler's own configuration loader
// (after Registry, as every Tessera binary does) and returns the Tessera
// plugin's decoded arguments.
func loadArgs(t *testing.T, path string) (*config.TesseraArgs, error) {
	t.Helper()
	Registry()
	cfg, err := options.LoadConfigFromFile(klog.Background(), path)
	if err != nil {
		return nil, err
	}
	for _, prof := range cfg.Profiles {
		for _, pc := range prof.PluginConfig {
			if pc.Name == Name {
				args, ok := pc.Args.(*config.TesseraArgs)
				if !ok {
					t.Fatalf("the loader decoded the Tessera args as %T, not as TesseraArgs", pc.Args)
				}
				return args, nil
			}
		}
	}
	t.Fatal("no Tessera pluginConfig after loading")
	return nil, nil
}

// setupErr builds the scheduler from the file as `tessera scheduler`
// does (kube-scheduler's Setup with Tessera's plugins, changed by opts)
// and returns the error, if any.
func setupErr(t *testing.T, path string, opts ...Option) error {
	t.Helper()
	o := options.NewOptions()
	o.ConfigFile = path
	o.SecureServing.BindPort = 0
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, _, err := app.Setup(ctx, o, withPlugins(opts)...)
	return err
}

// shippedArgs loads the Tessera plugin's arguments of the shipped
// configuration (deploy/scheduler/config.yaml) as the scheduler does.
func shippedArgs(t *testing.T) *config.TesseraArgs {
	t.Helper()
	raw, err := deploy.SchedulerConfigFor("/dev/null", 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	args, err := loadArgs(t, path)
	if err != nil {
		t.Fatal(err)
	}
	return args
}

func TestArgsShippedConfigDecodesTyped(t *testing.T) {
	args := shippedArgs(t)
	if err := config.ValidateTesseraArgs(argsPath, args, policies.Names()); err != nil {
		t.Fatalf("the shipped arguments are invalid: %v", err)
	}
	if args.ResourcePrefix != "nvidia.com" || args.PlacementPolicy == "" {
		t.Fatalf("shipped args decoded as %+v", args)
	}
}

// TestArgsDefaultIsShipped: a scheduler configured with no Tessera
// arguments runs the placement policy the shipped configuration names
// (deploy/scheduler/config.yaml, the chart's copy), so the code's default
// and what the docs describe as shipped are one policy.
func TestArgsDefaultIsShipped(t *testing.T) {
	shipped := shippedArgs(t)
	unset, err := loadArgs(t, shippedConfigWithArgs(t, map[string]any{}))
	if err != nil {
		t.Fatal(err)
	}
	if unset.PlacementPolicy != shipped.PlacementPolicy || api.DefaultPlacementPolicy != shipped.PlacementPolicy {
		t.Fatalf("placementPolicy: shipped %q, defaulted from no arguments %q, api.DefaultPlacementPolicy %q; want all three equal",
			shipped.PlacementPolicy, unset.PlacementPolicy, api.DefaultPlacementPolicy)
	}
}

func TestArgsDefaults(t *testing.T) {
	args, err := loadArgs(t, shippedConfigWithArgs(t, map[string]any{"placementPolicy": "fgd"}))
	if err != nil {
		t.Fatal(err)
	}
	want := config.TesseraArgs{
		ResourcePrefix:  api.DefaultResourcePrefix,
		NodePolicy:      api.DefaultNodePolicy,
		GPUPolicy:       api.DefaultGPUPolicy,
		PlacementPolicy: "fgd",
	}
	args.TypeMeta = want.TypeMeta
	if *args != want {
		t.Fatalf("defaulted args %+v, want %+v", *args, want)
	}
	// An unset placementPolicy is the node policy's.
	args, err = loadArgs(t, shippedConfigWithArgs(t, map[string]any{"nodePolicy": "spread"}))
	if err != nil {
		t.Fatal(err)
	}
	if args.PlacementPolicy != "spread" {
		t.Fatalf("placementPolicy defaulted to %q with nodePolicy spread, want spread", args.PlacementPolicy)
	}
}

// TestArgsStrict: a misspelled key, an unknown policy or a value of the
// wrong type stops the scheduler at start with an error that names it,
// instead of a silent default.
func TestArgsStrict(t *testing.T) {
	for _, tc := range []struct {
		name string
		args map[string]any
		want []string
	}{
		{"misspelled key", map[string]any{"placementPolicyy": "fgd"}, []string{`unknown field "placementPolicyy"`, Name}},
		{"key in the wrong case", map[string]any{"PlacementPolicy": "fgd"}, []string{`"PlacementPolicy"`}},
		{"unknown placement policy", map[string]any{"placementPolicy": "fgdd"}, []string{"placementPolicy", `"fgdd"`, "tessera"}},
		// The simulator's research baselines are not the scheduler's.
		{"simulator baseline", map[string]any{"placementPolicy": "bestfit"},
			[]string{"placementPolicy", `"bestfit"`, `supported values: "binpack", "spread", "fgd", "tessera"`}},
		{"unknown node policy", map[string]any{"nodePolicy": "packed"}, []string{"nodePolicy", `"packed"`}},
		{"unknown GPU policy", map[string]any{"gpuPolicy": "topology"}, []string{"gpuPolicy", `"topology"`}},
		{"bad resource prefix", map[string]any{"resourcePrefix": "Not A Domain"}, []string{"resourcePrefix", "Not A Domain"}},
		{"wrong type", map[string]any{"placementPolicy": 3}, []string{"placementPolicy"}},
		{"misspelled record signing key", map[string]any{"recordSigning": map[string]any{"disable": true}}, []string{`unknown field "recordSigning.disable"`}},
		{"bad record signing namespace", map[string]any{"recordSigning": map[string]any{"namespace": "Tessera_System"}}, []string{"recordSigning.namespace", "Tessera_System"}},
		{"bad record signing secret", map[string]any{"recordSigning": map[string]any{"keySecret": "a/b"}}, []string{"recordSigning.keySecret", "a/b"}},
		{"wrong kind", map[string]any{"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "NodeResourcesFitArgs"}, []string{"TesseraArgs"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := setupErr(t, shippedConfigWithArgs(t, tc.args))
			if err == nil {
				t.Fatal("the scheduler started")
			}
			t.Log(err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestArgsEveryPolicyBuilds: every policy the binaries run is accepted by
// the loader and builds the plugin (starting and scheduling with each is
// test/integration's TestEveryPolicyStarts).
func TestArgsEveryPolicyBuilds(t *testing.T) {
	for _, name := range policies.Names() {
		// No API server here: signing off (which the args must carry,
		// or the plugin fails reading its key Secret).
		path := shippedConfigWithArgs(t, map[string]any{"placementPolicy": name, "recordSigning": map[string]any{"disabled": true}})
		if err := setupErr(t, path); err != nil {
			t.Errorf("placementPolicy %s: %v", name, err)
		}
	}
}

// TestArgsWithPolicies: a scheduler built WithPolicies runs the policies
// of its catalogue, and only those.
func TestArgsWithPolicies(t *testing.T) {
	cat := policies.Catalogue{{Name: "test-binpack", New: func(*placement.Cluster, int64) placement.Policy { return placement.Binpack{} }}}
	path := shippedConfigWithArgs(t, map[string]any{"placementPolicy": "test-binpack", "recordSigning": map[string]any{"disabled": true}})
	if err := setupErr(t, path, WithPolicies(cat)); err != nil {
		t.Errorf("placementPolicy test-binpack of the catalogue: %v", err)
	}
	if err := setupErr(t, path); err == nil || !strings.Contains(err.Error(), `"test-binpack"`) {
		t.Errorf("placementPolicy test-binpack without the catalogue: %v, want an error naming it", err)
	}
	path = shippedConfigWithArgs(t, map[string]any{"placementPolicy": "tessera", "recordSigning": map[string]any{"disabled": true}})
	if err := setupErr(t, path, WithPolicies(cat)); err == nil || !strings.Contains(err.Error(), `supported values: "test-binpack"`) {
		t.Errorf("placementPolicy tessera outside the catalogue: %v, want an error naming the catalogue's", err)
	}
}

// TestArgsRawDecodedStrictly: arguments that reach the plugin undecoded
// (a framework built from a configuration loaded before Registry) are
// decoded as strictly as the loader does.
func TestArgsRawDecodedStrictly(t *testing.T) {
	if _, err := decodeArgs(rawArgs(`{"placementPolicy":"tessera","gpuPolicy":"spread"}`), policies.Names()); err != nil {
		t.Fatal(err)
	}
	_, err := decodeArgs(rawArgs(`{"placementPolicyy":"tessera"}`), policies.Names())
	if err == nil || !strings.Contains(err.Error(), `unknown field "placementPolicyy"`) {
		t.Fatalf("misspelled raw key: %v", err)
	}
	args, err := decodeArgs(nil, policies.Names())
	if err != nil || args.PlacementPolicy != api.DefaultPlacementPolicy {
		t.Fatalf("no args: %+v, %v", args, err)
	}
}

func rawArgs(s string) *runtime.Unknown {
	return &runtime.Unknown{Raw: []byte(s), ContentType: runtime.ContentTypeJSON}
}
