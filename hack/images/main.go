// Command images assembles Tessera's container image, one OCI image index
// for linux/amd64 and linux/arm64, from files built beforehand (the
// Makefile's `images` target, hack/images/build.sh), with
// go-containerregistry: no registry, no Docker daemon. It lives in a module
// of its own so that go-containerregistry's dependencies stay out of
// Tessera's go.mod.
//
//	images build   --out DIR --tar FILE --repository R --version V --revision C --created EPOCH \
//	               --platform linux/amd64=DIR --platform linux/arm64=DIR
//	images extract --layout DIR --platform linux/arm64 --to DIR
//	images rootfs  --root DIR --name REPOSITORY:TAG --tar FILE --created EPOCH \
//	               [--entrypoint ARG]... [--cmd ARG]... [--env K=V]... [--user U]
//
// rootfs (rootfs.go) is the image of a directory tree for this machine's
// platform: the containers of make e2e's real node (hack/e2e/images.sh).
//
// Each platform directory holds what build.sh put there: tessera (the
// binary), libtessera-limiter.so, tessera-hook, libc6/ (Debian's libc6 package of that
// architecture, unpacked with dpkg-deb -x) and libc6.control (its control
// fields, dpkg-deb -f). The image is two layers:
//
//   - base: the binary's shared-library closure (and the glibc libraries
//     NVIDIA's driver programs load) taken from libc6, libc6's copyright
//     file and dpkg status entry (so image scanners see the package), an
//     /etc/passwd and /etc/group with root and nonroot (65532), /tmp;
//   - tessera: /usr/local/bin/tessera,
//     /usr/local/lib/tessera/libtessera-limiter.so and
//     /usr/local/lib/tessera/tessera-hook (the OCI hook the chart's init
//     container copies to the host where the driver holds memory limits;
//     it runs there with the host's glibc, 2.34 or later).
//
// Every file gets a fixed owner (0:0 unless named), mode and mtime (the
// --created time, SOURCE_DATE_EPOCH), so the same inputs give the same
// digest.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

var errUsage = errors.New("usage: images build|extract|rootfs [flags] (images <command> -h)")

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errUsage
	}
	switch args[0] {
	case "build":
		return runBuild(args[1:], stdout, stderr)
	case "extract":
		return runExtract(args[1:], stderr)
	case "rootfs":
		return runRootfs(args[1:], stdout, stderr)
	}
	return fmt.Errorf("unknown command %q: %w", args[0], errUsage)
}

// platformFlag collects --platform os/arch=dir.
type platformFlag []platformInput

func (p *platformFlag) String() string { return fmt.Sprint(*p) }

func (p *platformFlag) Set(v string) error {
	plat, dir, ok := strings.Cut(v, "=")
	if !ok || dir == "" {
		return fmt.Errorf("--platform %q: want os/arch=directory", v)
	}
	arch, err := archFor(plat)
	if err != nil {
		return err
	}
	*p = append(*p, platformInput{arch: arch, dir: dir})
	return nil
}

func runBuild(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o buildOptions
	fs.StringVar(&o.out, "out", "", "OCI image layout directory to write (replaced)")
	fs.StringVar(&o.tar, "tar", "", "also write the layout as a tar file (what `ctr images import` reads); empty: none")
	fs.StringVar(&o.repository, "repository", "", "repository the image is named after (containerd's image name annotation; build.sh: the chart's image.repository)")
	fs.StringVar(&o.version, "version", "", "the image's version and tag (the chart's appVersion)")
	fs.StringVar(&o.revision, "revision", "", "source revision (the commit)")
	fs.Int64Var(&o.created, "created", -1, "creation time, seconds since 1970 (SOURCE_DATE_EPOCH: the commit's time)")
	fs.StringVar(&o.source, "source", "https://github.com/tessera-gpu/tessera", "source repository URL (OCI label)")
	fs.Var(&o.platforms, "platform", "os/arch=directory of that platform's inputs (repeat: linux/amd64, linux/arm64)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("build: unexpected arguments %q", fs.Args())
	}
	d, err := build(o)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, d)
	return nil
}

func runExtract(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("extract", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("layout", "", "OCI image layout directory (images build --out)")
	plat := fs.String("platform", "", "os/arch of the image to extract")
	to := fs.String("to", "", "directory to unpack the image's file system into (must not exist)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *plat == "" || *to == "" {
		return fmt.Errorf("extract: --layout, --platform and --to are required")
	}
	return extract(*dir, *plat, *to)
}
