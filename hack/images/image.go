package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Paths inside the image. The chart runs /usr/local/bin/tessera and its
// init container `tessera install-limiter` copies limiterPath (and, where
// the driver may hold memory limits, hookPath) to the host.
const (
	binaryPath  = "/usr/local/bin/tessera"
	limiterPath = "/usr/local/lib/tessera/libtessera-limiter.so"
	// hookPath is tessera-hook, the OCI hook the container runtime runs
	// on the host (cmd/tessera's HookImagePath).
	hookPath = "/usr/local/lib/tessera/tessera-hook"
	// nonroot is the image's default user; the node agent's pods run as
	// root (the chart says so).
	nonrootID = 65532
)

// nvidiaLibs are glibc libraries NVIDIA's driver programs load besides
// what the tessera binary needs (the node agent runs
// nvidia-cuda-mps-control from the driver root on nodes in mps mode).
var nvidiaLibs = []string{"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"}

// arch is one platform the image is built for.
type arch struct {
	goarch, variant string
	// triplet is Debian's multiarch directory of the architecture.
	triplet string
	machine elf.Machine
}

var arches = map[string]arch{
	"linux/amd64": {goarch: "amd64", triplet: "x86_64-linux-gnu", machine: elf.EM_X86_64},
	"linux/arm64": {goarch: "arm64", variant: "v8", triplet: "aarch64-linux-gnu", machine: elf.EM_AARCH64},
}

func archFor(platform string) (arch, error) {
	a, ok := arches[platform]
	if !ok {
		names := make([]string, 0, len(arches))
		for n := range arches {
			names = append(names, n)
		}
		sort.Strings(names)
		return arch{}, fmt.Errorf("platform %q: want one of %v", platform, names)
	}
	return a, nil
}

type platformInput struct {
	arch arch
	dir  string
}

type buildOptions struct {
	out, tar, repository, version, revision, source string
	created                                         int64
	platforms                                       platformFlag
}

// build writes the image index and returns its digest.
func build(o buildOptions) (v1.Hash, error) {
	switch {
	case o.out == "" || o.repository == "":
		return v1.Hash{}, fmt.Errorf("--out and --repository are required")
	case o.version == "" || strings.ContainsAny(o.version, " :/@"):
		return v1.Hash{}, fmt.Errorf("--version %q: want a tag such as 0.1.0", o.version)
	case o.created < 0:
		return v1.Hash{}, fmt.Errorf("--created is required (SOURCE_DATE_EPOCH, seconds)")
	case len(o.platforms) == 0:
		return v1.Hash{}, fmt.Errorf("at least one --platform is required")
	}
	created := time.Unix(o.created, 0).UTC()
	labels := map[string]string{
		"org.opencontainers.image.title":       "tessera",
		"org.opencontainers.image.description": "Tessera, GPU sharing for Kubernetes: scheduler, admission webhook, node agent and the GPU limiter library",
		"org.opencontainers.image.version":     o.version,
		"org.opencontainers.image.revision":    o.revision,
		"org.opencontainers.image.created":     created.Format(time.RFC3339),
		"org.opencontainers.image.source":      o.source,
		"org.opencontainers.image.url":         o.source,
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	idx = mutate.Annotations(idx, labels).(v1.ImageIndex)
	for _, p := range o.platforms {
		img, err := platformImage(p, created, labels)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("linux/%s: %w", p.arch.goarch, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return v1.Hash{}, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: cf.Platform()}})
	}
	if err := os.RemoveAll(o.out); err != nil {
		return v1.Hash{}, err
	}
	lp, err := layout.Write(o.out, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		// skopeo's oci:DIR:TAG and crane read the tag; containerd's
		// import names the image after io.containerd.image.name.
		"org.opencontainers.image.ref.name": o.version,
		"io.containerd.image.name":          o.repository + ":" + o.version,
	})); err != nil {
		return v1.Hash{}, err
	}
	if o.tar != "" {
		if err := tarDir(o.out, o.tar, created); err != nil {
			return v1.Hash{}, err
		}
	}
	return idx.Digest()
}

// platformImage is the image of one platform: the base layer and the
// tessera layer.
func platformImage(p platformInput, created time.Time, labels map[string]string) (v1.Image, error) {
	binary := filepath.Join(p.dir, "tessera")
	if err := checkELF(binary, p.arch.machine); err != nil {
		return nil, err
	}
	for _, f := range []string{"libtessera-limiter.so", "tessera-hook"} {
		if err := checkELF(filepath.Join(p.dir, f), p.arch.machine); err != nil {
			return nil, err
		}
	}
	base, pkgVersion, err := baseFiles(p, binary)
	if err != nil {
		return nil, err
	}
	app := newTree()
	if err := app.addFile(binaryPath, filepath.Join(p.dir, "tessera"), 0o755); err != nil {
		return nil, err
	}
	if err := app.addFile(limiterPath, filepath.Join(p.dir, "libtessera-limiter.so"), 0o644); err != nil {
		return nil, err
	}
	if err := app.addFile(hookPath, filepath.Join(p.dir, "tessera-hook"), 0o755); err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, l := range []struct {
		t   *tree
		why string
	}{
		{base, "glibc " + pkgVersion + " (Debian libc6: the binary's library closure), /etc/passwd, /etc/group, /tmp"},
		{app, "tessera, libtessera-limiter.so and tessera-hook"},
	} {
		b, err := l.t.tar(created)
		if err != nil {
			return nil, err
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
			tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, err
		}
		img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "hack/images: " + l.why}})
		if err != nil {
			return nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = "linux", p.arch.goarch, p.arch.variant
	cf.Created = v1.Time{Time: created}
	cf.Config = v1.Config{
		Entrypoint: []string{binaryPath},
		User:       fmt.Sprintf("%d:%d", nonrootID, nonrootID),
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		WorkingDir: "/",
		Labels:     labels,
	}
	return mutate.ConfigFile(img, cf)
}

// checkELF refuses a file that is not an ELF object of machine m (a
// binary of the wrong architecture in a platform's directory).
func checkELF(p string, m elf.Machine) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	defer f.Close()
	if f.Machine != m {
		return fmt.Errorf("%s is built for %v, want %v", p, f.Machine, m)
	}
	return nil
}

// baseFiles is the base layer: the binary's library closure from libc6
// plus nvidiaLibs, libc6's copyright and status entry, the users and /tmp.
// It returns libc6's version.
func baseFiles(p platformInput, binary string) (*tree, string, error) {
	root := filepath.Join(p.dir, "libc6")
	control, err := os.ReadFile(filepath.Join(p.dir, "libc6.control"))
	if err != nil {
		return nil, "", err
	}
	fields := controlFields(control)
	if fields["Package"] != "libc6" || fields["Architecture"] != p.arch.goarch || fields["Version"] == "" {
		return nil, "", fmt.Errorf("%s/libc6.control: want Package libc6, Architecture %s and a Version; got %q, %q, %q",
			p.dir, p.arch.goarch, fields["Package"], fields["Architecture"], fields["Version"])
	}
	t := newTree()
	libDirs := []string{"/lib/" + p.arch.triplet, "/usr/lib/" + p.arch.triplet}
	var need []string
	interp, needed, err := elfDeps(binary)
	if err != nil {
		return nil, "", err
	}
	if interp == "" {
		return nil, "", fmt.Errorf("%s has no program interpreter: want a dynamically linked cgo binary", binary)
	}
	// Shared objects 0755, as Debian ships glibc's.
	if err := t.addFromRoot(root, interp, 0o755); err != nil {
		return nil, "", fmt.Errorf("the program interpreter %s of %s: %w", interp, binary, err)
	}
	need = append(need, needed...)
	need = append(need, nvidiaLibs...)
	seen := map[string]bool{}
	for len(need) > 0 {
		lib := need[0]
		need = need[1:]
		if seen[lib] {
			continue
		}
		seen[lib] = true
		found := ""
		for _, d := range libDirs {
			if _, err := os.Lstat(filepath.Join(root, d, lib)); err == nil {
				found = path.Join(d, lib)
				break
			}
		}
		if found == "" {
			return nil, "", fmt.Errorf("%s, needed by %s or its libraries, is not in libc6 %s (looked in %v): the image would not start", lib, binary, fields["Version"], libDirs)
		}
		if err := t.addFromRoot(root, found, 0o755); err != nil {
			return nil, "", err
		}
		real, err := filepath.EvalSymlinks(filepath.Join(root, found))
		if err != nil {
			return nil, "", err
		}
		_, more, err := elfDeps(real)
		if err != nil {
			return nil, "", err
		}
		need = append(need, more...)
	}
	if err := t.addFromRoot(root, "/usr/share/doc/libc6/copyright", 0o644); err != nil {
		return nil, "", err
	}
	// Image scanners read dpkg's per-package status files.
	status := "Package: libc6\nStatus: install ok installed\n" + strings.TrimPrefix(strings.TrimSpace(string(control)), "Package: libc6\n") + "\n"
	t.addBytes("/var/lib/dpkg/status.d/libc6", []byte(status), 0o644)
	t.addBytes("/etc/passwd", fmt.Appendf(nil, "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", nonrootID, nonrootID), 0o644)
	t.addBytes("/etc/group", fmt.Appendf(nil, "root:x:0:\nnonroot:x:%d:\n", nonrootID), 0o644)
	t.addDir("/tmp", 0o777|fs.ModeSticky, 0)
	t.addDir("/root", 0o700, 0)
	t.addDir("/home/nonroot", 0o700, nonrootID)
	return t, fields["Version"], nil
}

// elfDeps returns an ELF file's program interpreter and DT_NEEDED entries.
func elfDeps(p string) (string, []string, error) {
	f, err := elf.Open(p)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", p, err)
	}
	defer f.Close()
	interp := ""
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b, err := io.ReadAll(prog.Open())
			if err != nil {
				return "", nil, err
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", p, err)
	}
	return interp, libs, nil
}

// controlFields parses the top-level "Key: value" lines of a Debian
// control file.
func controlFields(b []byte) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == ' ' || line[0] == '\t' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// entry is one file, directory or symlink of a layer.
type entry struct {
	mode     fs.FileMode // permission bits (and sticky)
	typ      byte
	uid      int
	data     []byte
	linkname string
}

// tree is a layer's content by absolute path; parents are added as
// directories owned by root, mode 0755.
type tree struct{ entries map[string]entry }

func newTree() *tree { return &tree{entries: map[string]entry{}} }

func (t *tree) parents(p string) {
	for d := path.Dir(p); d != "/"; d = path.Dir(d) {
		if _, ok := t.entries[d]; !ok {
			t.entries[d] = entry{mode: 0o755, typ: tar.TypeDir}
		}
	}
}

func (t *tree) addDir(p string, mode fs.FileMode, uid int) {
	t.parents(p)
	t.entries[p] = entry{mode: mode, typ: tar.TypeDir, uid: uid}
}

func (t *tree) addBytes(p string, b []byte, mode fs.FileMode) {
	t.parents(p)
	t.entries[p] = entry{mode: mode, typ: tar.TypeReg, data: b}
}

func (t *tree) addFile(p, src string, mode fs.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	t.addBytes(p, b, mode)
	return nil
}

func (t *tree) addSymlink(p, target string) {
	t.parents(p)
	t.entries[p] = entry{mode: 0o777, typ: tar.TypeSymlink, linkname: target}
}

// addFromRoot adds p as it is under root: a symlink as a symlink (and its
// target), a file with mode (not the input's: that would make the digest
// depend on the checkout's umask).
func (t *tree) addFromRoot(root, p string, mode fs.FileMode) error {
	for range 16 {
		if _, ok := t.entries[p]; ok {
			return nil
		}
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			return t.addFile(p, filepath.Join(root, p), mode)
		}
		target, err := os.Readlink(filepath.Join(root, p))
		if err != nil {
			return err
		}
		t.addSymlink(p, target)
		if !path.IsAbs(target) {
			target = path.Join(path.Dir(p), target)
		}
		p = path.Clean(target)
	}
	return fmt.Errorf("%s: too many symlinks", p)
}

// tar writes the tree sorted by path, every entry with mtime created.
func (t *tree) tar(created time.Time) ([]byte, error) {
	names := make([]string, 0, len(t.entries))
	for n := range t.entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	for _, n := range names {
		e := t.entries[n]
		h := &tar.Header{
			Name: strings.TrimPrefix(n, "/"), Typeflag: e.typ, Mode: int64(e.mode.Perm()), Linkname: e.linkname,
			Uid: e.uid, Gid: e.uid, ModTime: created, Format: tar.FormatPAX,
		}
		if e.mode&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		if e.typ == tar.TypeDir {
			h.Name += "/"
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.data))
		}
		if err := w.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := w.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// walkTree calls add for every entry below root (not root itself), with
// its name in the image: "/" and its path relative to root.
func walkTree(root string, add func(name, p string, d fs.DirEntry) error) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		return add("/"+filepath.ToSlash(rel), p, d)
	})
}

// tarDir writes directory dir as a tar file: sorted, owner 0, mtime created.
func tarDir(dir, out string, created time.Time) error {
	t := newTree()
	err := walkTree(dir, func(name, p string, d fs.DirEntry) error {
		if d.IsDir() {
			t.addDir(name, 0o755, 0)
			return nil
		}
		return t.addFile(name, p, 0o644)
	})
	if err != nil {
		return err
	}
	b, err := t.tar(created)
	if err != nil {
		return err
	}
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// extract unpacks the image of platform plat from the layout at dir into
// to, as a container runtime would (for the smoke test).
func extract(dir, plat, to string) error {
	a, err := archFor(plat)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(to); err == nil {
		return fmt.Errorf("%s exists: want a new directory", to)
	}
	lp, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return err
	}
	top, err := lp.IndexManifest()
	if err != nil {
		return err
	}
	if len(top.Manifests) != 1 {
		return fmt.Errorf("%s: %d entries in index.json, want one image index", dir, len(top.Manifests))
	}
	idx, err := lp.ImageIndex(top.Manifests[0].Digest)
	if err != nil {
		return err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	var img v1.Image
	for _, m := range im.Manifests {
		if m.Platform != nil && m.Platform.OS == "linux" && m.Platform.Architecture == a.goarch {
			if img, err = idx.Image(m.Digest); err != nil {
				return err
			}
		}
	}
	if img == nil {
		return fmt.Errorf("%s: no image for %s", dir, plat)
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean("/" + h.Name)
		dst := filepath.Join(to, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return err
			}
			if err := os.Chmod(dst, fs.FileMode(h.Mode).Perm()); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, dst); err != nil {
				return err
			}
		case tar.TypeReg:
			f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, fs.FileMode(h.Mode).Perm())
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: unexpected tar entry type %q", name, h.Typeflag)
		}
	}
}
