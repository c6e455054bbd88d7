// Package need lets a test say what it needs from the machine beyond Go
// (root, a program, NVIDIA's non-free binaries) so that `go test ./...`
// passes anywhere: where the machine lacks it, the test is skipped with a
// message naming what is missing and how to get it.
//
//	need.Root(t, "mounts a tmpfs over /var/lib/kubelet")
//	mps := need.File(t, bin, "run hack/fetch-mps-control.sh")
//
// With TESSERA_TEST_STRICT=1 in the environment (`make test` and CI set
// it), a missing need fails the test instead of skipping it, so a run that
// must run everything never skips silently. The messages all start with
// "needs ", so `go test -v ./... | grep -A1 -- '--- SKIP'` lists what a
// machine lacks. Shipped code does not use this package.
package need

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// StrictEnv is the environment variable that turns a missing need into a
// failure: set to anything but "" or "0".
const StrictEnv = "TESSERA_TEST_STRICT"

// Strict reports whether a missing need fails the test (StrictEnv set).
func Strict() bool {
	v := os.Getenv(StrictEnv)
	return v != "" && v != "0"
}

// Root skips the test unless it runs as root (effective user 0); why says
// what the test needs root for.
func Root(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "root ("+why+")", "run the tests as root")
	}
}

// RootMain is Root for a TestMain whose tests all need root (it runs them
// in a private mount namespace, or starts root-only machinery for all of
// them): as root it returns true. Otherwise it reports the missing need
// for every test of the package pkg, as a skip on stdout, or as a failure
// on stderr under StrictEnv, and returns false and the status the
// TestMain exits with (0, or 1 under StrictEnv).
//
//	if code, ok := need.RootMain("test/integration/lab", "mount and PID namespaces"); !ok {
//		os.Exit(code)
//	}
func RootMain(pkg, why string) (code int, ok bool) {
	if os.Geteuid() == 0 {
		return 0, true
	}
	msg := Message("root ("+why+")", "run the tests as root")
	if Strict() {
		fmt.Fprintf(os.Stderr, "FAIL: every test of %s %s (%s=1: a missing need fails)\n", pkg, msg, StrictEnv)
		return 1, false
	}
	fmt.Printf("--- SKIP: every test of %s %s\n", pkg, msg)
	return 0, false
}

// Command returns the path of the program name found on PATH, skipping
// the test if there is none; install says how to get it (e.g. "apt-get
// install util-linux").
func Command(t testing.TB, name, install string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		Missing(t, "the program "+name+" (not on PATH)", install)
	}
	return path
}

// File returns path, skipping the test if nothing is there; howToGet says
// how to get it (e.g. the script that fetches it).
func File(t testing.TB, path, howToGet string) string {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		Missing(t, path+" (missing)", howToGet)
	}
	return path
}

// Missing skips the test, or fails it under StrictEnv, with the message
// "needs WHAT: HOWTOGET".
func Missing(t testing.TB, what, howToGet string) {
	t.Helper()
	msg := Message(what, howToGet)
	if Strict() {
		t.Fatalf("%s (%s=1: a missing need fails the test)", msg, StrictEnv)
	}
	t.Skip(msg)
}

// Message is the text of a missing need.
func Message(what, howToGet string) string {
	return fmt.Sprintf("needs %s: %s", what, howToGet)
}
