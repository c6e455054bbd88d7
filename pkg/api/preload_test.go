package api

import (
	"reflect"
	"strings"
	"testing"
)

func TestParsePreloads(t *testing.T) {
	got, err := ParsePreloads(" /usr/lib/x86_64-linux-gnu/libjemalloc.so.2,\n/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ,/opt/app/lib/libfoo.so")
	want := []string{"/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "/opt/app/lib/libfoo.so"}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("%v %v", got, err)
	}
	if got, err := ParsePreloads(""); err != nil || len(got) != 0 {
		t.Errorf("empty: %v %v", got, err)
	}
	for _, bad := range []struct{ value, want string }{
		{"libjemalloc.so.2", "absolute"},
		{"/usr/lib/../../tmp/libx.so", "clean"},
		{"/tmp/libx.so", "must be under"},
		{"/home/user/libx.so", "must be under"},
		{"/usr/local/tessera/libtessera-limiter.so", "GPU limiter's directory"},
		{"/usr/lib/libx.so.2a", "shared library"},
		{"/usr/lib/libx", "shared library"},
		{"/usr/lib/lib x.so", "letters, digits"},
		{"/usr/lib/$LIB/libx.so", "letters, digits"},
		{strings.Repeat("/usr/lib/liba.so,", MaxPreloads+1), "more than 8"},
	} {
		_, err := ParsePreloads(bad.value)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: %v, want an error mentioning %q", bad.value, err, bad.want)
		}
	}
	if got := string(PreloadList("/usr/local/tessera/libtessera-limiter.so", want[:1])); got != "/usr/local/tessera/libtessera-limiter.so\n/usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n" {
		t.Errorf("%q", got)
	}
}
