// Package apply creates or updates the objects of a directory of
// manifests by server-side apply, as `kubectl apply --server-side -f DIR`
// does, so that the emulated cluster's demo needs no kubectl.
package apply

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
)

// Dir creates or updates every object of the *.yaml, *.yml and *.json
// files of dir (not its subdirectories) by server-side apply, as
// `kubectl apply --server-side -f dir` would, and prints a line per object
// applied to out; objects without a namespace go to "default".
func Dir(ctx context.Context, kubeconfig, dir string, out io.Writer) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var files []string
	for _, e := range entries {
		if !e.IsDir() && (strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".yml") || strings.HasSuffix(e.Name(), ".json")) {
			files = append(files, filepath.Join(dir, e.Name()))
		}
	}
	sort.Strings(files)
	var errs []error
	for _, f := range files {
		objs, err := readObjects(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, obj := range objs {
			gvk := obj.GroupVersionKind()
			m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %s %s: %w", f, gvk.Kind, obj.GetName(), err))
				continue
			}
			ri := dyn.Resource(m.Resource)
			var target dynamic.ResourceInterface = ri
			if m.Scope.Name() == "namespace" {
				if obj.GetNamespace() == "" {
					obj.SetNamespace(metav1.NamespaceDefault)
				}
				target = ri.Namespace(obj.GetNamespace())
			}
			data, err := obj.MarshalJSON()
			if err != nil {
				errs = append(errs, err)
				continue
			}
			force := true
			if _, err := target.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "tessera-lab", Force: &force}); err != nil {
				errs = append(errs, fmt.Errorf("%s: %s %s: %w", f, strings.ToLower(gvk.Kind), obj.GetName(), err))
				continue
			}
			fmt.Fprintf(out, "%s/%s applied\n", strings.ToLower(gvk.Kind), obj.GetName())
		}
	}
	return errors.Join(errs...)
}

// readObjects decodes every document of a YAML or JSON file.
func readObjects(path string) ([]*unstructured.Unstructured, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}
