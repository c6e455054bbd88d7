package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// TestShippedArgsParse: every container of the chart's golden renders and
// of deploy/ that runs the tessera image passes arguments its subcommand
// accepts (run with -h appended: an unknown flag or a bad value fails
// before the help is printed), so a renamed or removed flag cannot ship.
func TestShippedArgsParse(t *testing.T) {
	files, err := filepath.Glob("../../charts/testdata/*.golden.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden renders: %v", err)
	}
	more, _ := filepath.Glob("../../deploy/*/*.yaml")
	files = append(files, more...)
	checked := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
		for {
			doc, err := r.Read()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			var obj struct {
				Kind string
				Spec struct {
					Template struct {
						Spec struct {
							Containers, InitContainers []struct {
								Name, Image   string
								Command, Args []string
							}
						}
					}
				}
			}
			if err := yaml.Unmarshal(doc, &obj); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			ps := obj.Spec.Template.Spec
			for _, c := range append(ps.InitContainers, ps.Containers...) {
				if !strings.Contains(c.Image, "/tessera") {
					continue
				}
				if len(c.Command) > 0 {
					t.Errorf("%s: container %s has a command %q: the image has only tessera (its entrypoint), no shell", f, c.Name, c.Command)
					continue
				}
				if len(c.Args) == 0 {
					t.Errorf("%s: container %s has no arguments", f, c.Name)
					continue
				}
				var out, errOut bytes.Buffer
				if code := run(context.Background(), append(append([]string{}, c.Args...), "-h"), &out, &errOut); code != 0 {
					t.Errorf("%s: container %s: tessera %q exits %d:\n%s", f, c.Name, c.Args, code, errOut.String())
				}
				checked[c.Args[0]] = true
			}
		}
	}
	for _, cmd := range []string{"scheduler", "webhook", "node-agent", "kubelet-shim", "install-limiter"} {
		if !checked[cmd] {
			t.Errorf("no shipped container runs tessera %s", cmd)
		}
	}
}
