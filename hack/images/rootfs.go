package main

// images rootfs: a single-platform image of a directory tree, for the
// containers of make e2e's real node (hack/e2e/images.sh: the pause image,
// a Debian 12 userland, busybox-static), built as Tessera's own image is.

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// listFlag collects a repeated flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

type rootfsOptions struct {
	root, name, tar, user, description string
	created                            int64
	entrypoint, cmd, env               listFlag
}

func runRootfs(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("rootfs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o rootfsOptions
	fs.StringVar(&o.root, "root", "", "the image's file system (a directory; its files' permission bits are kept, owners are root)")
	fs.StringVar(&o.name, "name", "", "the image's name, repository:tag (containerd's import names it so)")
	fs.StringVar(&o.tar, "tar", "", "the OCI image layout, as a tar file (what `ctr images import` reads)")
	fs.StringVar(&o.user, "user", "", "the image's user (empty: root)")
	fs.StringVar(&o.description, "description", "", "what the image is (OCI label)")
	fs.Int64Var(&o.created, "created", -1, "creation time, seconds since 1970 (SOURCE_DATE_EPOCH)")
	fs.Var(&o.entrypoint, "entrypoint", "an entrypoint argument (repeat)")
	fs.Var(&o.cmd, "cmd", "a command argument (repeat)")
	fs.Var(&o.env, "env", "KEY=VALUE of the image's environment (repeat; PATH has a default)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("rootfs: unexpected arguments %q", fs.Args())
	}
	d, err := buildRootfs(o)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, d)
	return nil
}

// buildRootfs writes the image of o.root for this machine's platform and
// returns its digest.
func buildRootfs(o rootfsOptions) (v1.Hash, error) {
	switch {
	case o.root == "" || o.name == "" || o.tar == "":
		return v1.Hash{}, fmt.Errorf("rootfs: --root, --name and --tar are required")
	case !strings.Contains(path.Base(o.name), ":"):
		return v1.Hash{}, fmt.Errorf("rootfs: --name %q: want repository:tag", o.name)
	case o.created < 0:
		return v1.Hash{}, fmt.Errorf("rootfs: --created is required (SOURCE_DATE_EPOCH, seconds)")
	}
	a, err := archFor("linux/" + runtime.GOARCH)
	if err != nil {
		return v1.Hash{}, err
	}
	created := time.Unix(o.created, 0).UTC()
	t, err := treeOf(o.root)
	if err != nil {
		return v1.Hash{}, err
	}
	b, err := t.tar(created)
	if err != nil {
		return v1.Hash{}, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return v1.Hash{}, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "hack/images rootfs"}}); err != nil {
		return v1.Hash{}, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return v1.Hash{}, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = "linux", a.goarch, a.variant
	cf.Created = v1.Time{Time: created}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	for _, e := range o.env {
		if strings.HasPrefix(e, "PATH=") {
			env[0] = e
		} else {
			env = append(env, e)
		}
	}
	cf.Config = v1.Config{Entrypoint: o.entrypoint, Cmd: o.cmd, Env: env, User: o.user, WorkingDir: "/"}
	if o.description != "" {
		cf.Config.Labels = map[string]string{"org.opencontainers.image.description": o.description}
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return v1.Hash{}, err
	}
	dir, err := os.MkdirTemp(filepath.Dir(o.tar), ".rootfs-layout-")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	tag := o.name[strings.LastIndex(o.name, ":")+1:]
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag,
		"io.containerd.image.name":          o.name,
	})); err != nil {
		return v1.Hash{}, err
	}
	if err := tarDir(dir, o.tar, created); err != nil {
		return v1.Hash{}, err
	}
	return img.Digest()
}

// treeOf is the tree of the directory root: directories, regular files
// (permission bits kept, set-id bits dropped) and symbolic links; owners
// are root. Anything else (devices, sockets) is refused.
func treeOf(root string) (*tree, error) {
	t := newTree()
	err := walkTree(root, func(name, p string, d fs.DirEntry) error {
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch m := fi.Mode(); {
		case m.IsDir():
			t.addDir(name, m.Perm()|m&fs.ModeSticky, 0)
		case m&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			t.addSymlink(name, target)
		case m.IsRegular():
			return t.addFile(name, p, m.Perm())
		default:
			return fmt.Errorf("%s: %v is neither a file, a directory nor a symbolic link", p, m.Type())
		}
		return nil
	})
	return t, err
}
