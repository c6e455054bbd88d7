package main

import (
	"archive/tar"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// hostPlatform is the build machine's platform and its arch.
func hostPlatform(t *testing.T) (string, arch) {
	t.Helper()
	p := "linux/" + runtime.GOARCH
	a, err := archFor(p)
	if err != nil {
		t.Fatalf("the images are built for amd64 and arm64 only: %v", err)
	}
	return p, a
}

func copyFile(t *testing.T, from, to string, mode fs.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, mode); err != nil {
		t.Fatal(err)
	}
}

// inputs lays out a platform directory from the build machine's own
// files: a dynamically linked program as tessera, a shared library as the
// limiter, the machine's glibc as libc6 (the layout dpkg-deb -x makes).
func inputs(t *testing.T) (string, string) {
	t.Helper()
	plat, a := hostPlatform(t)
	dir := t.TempDir()
	// A dynamically linked program stands in for tessera.
	prog := "/bin/true"
	interp, _, err := elfDeps(prog)
	if err != nil || interp == "" {
		t.Fatalf("%s: want a dynamically linked program to stand in for tessera: %v", prog, err)
	}
	copyFile(t, prog, filepath.Join(dir, "tessera"), 0o700)
	copyFile(t, prog, filepath.Join(dir, "tessera-hook"), 0o700)
	libdir := "/lib/" + a.triplet
	copyFile(t, filepath.Join(libdir, "libm.so.6"), filepath.Join(dir, "libtessera-limiter.so"), 0o600)
	root := filepath.Join(dir, "libc6")
	for _, l := range append([]string{filepath.Base(interp)}, nvidiaLibs...) {
		copyFile(t, filepath.Join(libdir, l), filepath.Join(root, libdir, l), 0o644)
	}
	// The interpreter's path as Debian ships it: a symlink into libdir.
	if filepath.Dir(interp) != libdir {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(interp)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(libdir, filepath.Base(interp)), filepath.Join(root, interp)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, libdir, filepath.Base(interp)), 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, "/etc/hostname", filepath.Join(root, "usr/share/doc/libc6/copyright"), 0o644)
	control := "Package: libc6\nSource: glibc\nVersion: 2.36-9+test1\nArchitecture: " + a.goarch + "\nDescription: GNU C Library\n more text\n"
	if err := os.WriteFile(filepath.Join(dir, "libc6.control"), []byte(control), 0o644); err != nil {
		t.Fatal(err)
	}
	return plat, dir
}

func options(t *testing.T, plat, dir string) buildOptions {
	t.Helper()
	o := buildOptions{out: filepath.Join(t.TempDir(), "oci"), repository: "ghcr.io/tessera-gpu/tessera", version: "0.1.0",
		revision: "abc", created: 1700000000, source: "https://github.com/tessera-gpu/tessera"}
	if err := o.platforms.Set(plat + "=" + dir); err != nil {
		t.Fatal(err)
	}
	return o
}

// TestReproducible: the same inputs give the same digest whatever their
// files' times, modes and the output directory; other content another.
func TestReproducible(t *testing.T) {
	plat, dir := inputs(t)
	o := options(t, plat, dir)
	o.tar = filepath.Join(t.TempDir(), "oci.tar")
	first, err := build(o)
	if err != nil {
		t.Fatal(err)
	}
	tar1, err := os.ReadFile(o.tar)
	if err != nil {
		t.Fatal(err)
	}
	// Touch and chmod every input, as a fresh checkout or rebuild would.
	later := time.Now().Add(time.Hour)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink != 0 {
			return err
		}
		if !d.IsDir() {
			if err := os.Chmod(p, 0o640); err != nil {
				return err
			}
		}
		return os.Chtimes(p, later, later)
	})
	if err != nil {
		t.Fatal(err)
	}
	o2 := options(t, plat, dir)
	o2.tar = filepath.Join(t.TempDir(), "oci.tar")
	second, err := build(o2)
	if err != nil {
		t.Fatal(err)
	}
	if first != second {
		t.Errorf("digests differ: %s, then %s", first, second)
	}
	tar2, err := os.ReadFile(o2.tar)
	if err != nil {
		t.Fatal(err)
	}
	if string(tar1) != string(tar2) {
		t.Error("the layout tars differ")
	}
	// Different content, different digest.
	f, err := os.OpenFile(filepath.Join(dir, "libtessera-limiter.so"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte{0}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	third, err := build(options(t, plat, dir))
	if err != nil {
		t.Fatal(err)
	}
	if third == first {
		t.Error("a changed limiter library leaves the digest unchanged")
	}
	o4 := options(t, plat, dir)
	o4.created++
	if fourth, err := build(o4); err != nil || fourth == third {
		t.Errorf("another SOURCE_DATE_EPOCH, same digest: %v", err)
	}
}

// TestLayout: the image's files, modes, users and configuration, read
// back from the written layout.
func TestLayout(t *testing.T) {
	plat, dir := inputs(t)
	o := options(t, plat, dir)
	if _, err := build(o); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), "root")
	if err := extract(o.out, plat, root); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]fs.FileMode{
		binaryPath: 0o755, limiterPath: 0o644, hookPath: 0o755, "/etc/passwd": 0o644, "/etc/group": 0o644,
		"/var/lib/dpkg/status.d/libc6": 0o644, "/usr/share/doc/libc6/copyright": 0o644, "/tmp": 0o777, "/home/nonroot": 0o700,
	} {
		fi, err := os.Stat(filepath.Join(root, p))
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode().Perm(), want)
		}
	}
	interp, needed, err := elfDeps(filepath.Join(root, binaryPath))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, interp)); err != nil {
		t.Errorf("the program interpreter %s: %v", interp, err)
	}
	_, a := hostPlatform(t)
	for _, l := range append(needed, nvidiaLibs...) {
		if _, err := os.Stat(filepath.Join(root, "lib", a.triplet, l)); err != nil {
			t.Errorf("%s: %v", l, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(root, "bin/sh")); err == nil {
		t.Error("a shell in the image")
	}
	b, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if !strings.Contains(string(b), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd: %s", b)
	}
	b, _ = os.ReadFile(filepath.Join(root, "var/lib/dpkg/status.d/libc6"))
	if s := string(b); !strings.HasPrefix(s, "Package: libc6\nStatus: install ok installed\n") || !strings.Contains(s, "Version: 2.36-9+test1\n") || strings.Count(s, "Package:") != 1 {
		t.Errorf("status entry:\n%s", b)
	}

	lp, err := layout.ImageIndexFromPath(o.out)
	if err != nil {
		t.Fatal(err)
	}
	top, err := lp.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(top.Manifests) != 1 || top.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "0.1.0" ||
		top.Manifests[0].Annotations["io.containerd.image.name"] != "ghcr.io/tessera-gpu/tessera:0.1.0" || !top.Manifests[0].MediaType.IsIndex() {
		t.Fatalf("index.json: %+v", top.Manifests)
	}
	idx, err := lp.ImageIndex(top.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Platform == nil || im.Manifests[0].Platform.Architecture != a.goarch || im.Manifests[0].Platform.Variant != a.variant {
		t.Fatalf("index: %+v", im.Manifests)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if cf.OS != "linux" || cf.Architecture != a.goarch || c.User != "65532:65532" || len(c.Entrypoint) != 1 || c.Entrypoint[0] != binaryPath ||
		c.Labels["org.opencontainers.image.version"] != "0.1.0" || c.Labels["org.opencontainers.image.revision"] != "abc" ||
		c.Labels["org.opencontainers.image.created"] != "2023-11-14T22:13:20Z" || !cf.Created.Time.Equal(time.Unix(1700000000, 0)) {
		t.Errorf("config: %+v", cf)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("layers: %d %v", len(layers), err)
	}
	if mt, _ := layers[0].MediaType(); mt != "application/vnd.oci.image.layer.v1.tar+gzip" {
		t.Errorf("layer media type %s", mt)
	}
	rc, err := layers[1].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var files []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeDir {
			files = append(files, h.Name)
		}
		if h.Uid != 0 || !h.ModTime.Equal(time.Unix(1700000000, 0)) {
			t.Errorf("%s: uid %d, mtime %v", h.Name, h.Uid, h.ModTime)
		}
	}
	if strings.Join(files, " ") != "usr/local/bin/tessera usr/local/lib/tessera/libtessera-limiter.so usr/local/lib/tessera/tessera-hook" {
		t.Errorf("the tessera layer holds %q", files)
	}
}

func TestRefusals(t *testing.T) {
	plat, dir := inputs(t)
	other := "linux/arm64"
	if plat == other {
		other = "linux/amd64"
	}
	o := options(t, plat, dir)
	o.platforms = nil
	if err := o.platforms.Set(other + "=" + dir); err != nil {
		t.Fatal(err)
	}
	if _, err := build(o); err == nil || !strings.Contains(err.Error(), "tessera is built for") {
		t.Errorf("a binary of the wrong architecture: %v", err)
	}
	_, a := hostPlatform(t)
	if err := os.Remove(filepath.Join(dir, "libc6/lib", a.triplet, "librt.so.1")); err != nil {
		t.Fatal(err)
	}
	if _, err := build(options(t, plat, dir)); err == nil || !strings.Contains(err.Error(), "librt.so.1") {
		t.Errorf("a library missing from libc6: %v", err)
	}
	for _, v := range []string{"", "0.1.0:latest", "a/b"} {
		o := options(t, plat, dir)
		o.version = v
		if _, err := build(o); err == nil || !strings.Contains(err.Error(), "--version") {
			t.Errorf("version %q: %v", v, err)
		}
	}
	var p platformFlag
	if err := p.Set("linux/riscv64=x"); err == nil || !strings.Contains(err.Error(), "linux/amd64") {
		t.Errorf("riscv64: %v", err)
	}
}
