package need

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// outcome runs check against a testing.TB that records a skip or a
// failure (ending the check's goroutine, as testing does).
func outcome(t *testing.T, check func(testing.TB)) (skipped, failed string) {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		check(r)
	}()
	<-done
	return r.skipped, r.failed
}

type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Skip(args ...any) {
	r.skipped = fmt.Sprint(args...)
	runtime.Goexit()
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestMissingSkipsNamingWhatAndHow(t *testing.T) {
	t.Setenv(StrictEnv, "")
	absent := filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")
	skipped, failed := outcome(t, func(tb testing.TB) { File(tb, absent, "run hack/fetch-mps-control.sh") })
	if failed != "" || skipped != "needs "+absent+" (missing): run hack/fetch-mps-control.sh" {
		t.Errorf("skipped %q, failed %q", skipped, failed)
	}
	skipped, failed = outcome(t, func(tb testing.TB) { Command(tb, "tessera-no-such-program", "apt-get install nothing") })
	if failed != "" || skipped != "needs the program tessera-no-such-program (not on PATH): apt-get install nothing" {
		t.Errorf("skipped %q, failed %q", skipped, failed)
	}
}

func TestStrictTurnsTheSkipIntoAFailure(t *testing.T) {
	for _, v := range []string{"1", "yes"} {
		t.Setenv(StrictEnv, v)
		skipped, failed := outcome(t, func(tb testing.TB) { Command(tb, "tessera-no-such-program", "apt-get install nothing") })
		if skipped != "" || !strings.HasPrefix(failed, "needs the program tessera-no-such-program (not on PATH): apt-get install nothing") ||
			!strings.Contains(failed, StrictEnv+"=1") {
			t.Errorf("%s=%s: skipped %q, failed %q", StrictEnv, v, skipped, failed)
		}
	}
	t.Setenv(StrictEnv, "0")
	if Strict() {
		t.Errorf("%s=0 is strict", StrictEnv)
	}
}

func TestPresentNeedsPass(t *testing.T) {
	t.Setenv(StrictEnv, "1")
	skipped, failed := outcome(t, func(tb testing.TB) {
		if got := File(tb, t.TempDir(), "nothing"); got == "" {
			tb.Fatalf("File returned nothing")
		}
		if got := Command(tb, "sh", "nothing"); !strings.HasSuffix(got, "/sh") {
			tb.Fatalf("Command(sh) = %q", got)
		}
	})
	if skipped != "" || failed != "" {
		t.Errorf("present needs: skipped %q, failed %q", skipped, failed)
	}
}
