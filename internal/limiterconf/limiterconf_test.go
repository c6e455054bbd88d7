package limiterconf

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const (
	uuid0 = "GPU-6a1f2b3c-0d4e-5f60-7182-93a4b5c6d7e8"
	uuid1 = "GPU-00000000-1111-2222-3333-444444444444"
)

func u64(v uint64) *uint64 { return &v }

func sample() Config {
	return Config{
		StatePath:         "/tessera/state/cache",
		Elastic:           true,
		ContextReserveMiB: u64(256),
		Devices: []Device{
			{UUID: uuid0, MemoryMiB: 4096, SMPercent: 30},
			{UUID: uuid1, MemoryMiB: 0, SMPercent: 100},
		},
	}
}

func TestEncodeParseRoundTrip(t *testing.T) {
	for _, c := range []Config{
		sample(),
		{StatePath: "/s", Devices: []Device{{UUID: uuid0, MemoryMiB: 1, SMPercent: 0}}},
		{StatePath: "/s", ContextReserveMiB: u64(0), Devices: []Device{{UUID: "MIG-" + uuid1[4:], MemoryMiB: MaxMiB}}},
	} {
		b, err := Encode(c)
		if err != nil {
			t.Fatalf("Encode(%+v): %v", c, err)
		}
		got, err := Parse(b)
		if err != nil {
			t.Fatalf("Parse(Encode(%+v)): %v\n%s", c, err, b)
		}
		if !reflect.DeepEqual(got, c) {
			t.Errorf("round trip:\n got %+v\nwant %+v\nfile:\n%s", got, c, b)
		}
	}
}

func TestEncodeFormat(t *testing.T) {
	b, err := Encode(sample())
	if err != nil {
		t.Fatal(err)
	}
	want := "# written by the Tessera node agent; read-only in the container\n" +
		"version=1\nstate=/tessera/state/cache\nelastic=1\ncontext_reserve=256m\n" +
		"device.0.uuid=" + uuid0 + "\ndevice.0.memory=4096m\ndevice.0.sm=30\n" +
		"device.1.uuid=" + uuid1 + "\ndevice.1.memory=0m\ndevice.1.sm=100\n"
	if string(b) != want {
		t.Errorf("Encode:\n%s\nwant:\n%s", b, want)
	}
}

func TestValidateRejects(t *testing.T) {
	dev := Device{UUID: uuid0, MemoryMiB: 1024, SMPercent: 50}
	many := make([]Device, MaxDevices+1)
	for i := range many {
		many[i] = Device{UUID: fmt.Sprintf("GPU-00000000-0000-0000-0000-%012x", i), MemoryMiB: 1}
	}
	cases := []struct {
		name string
		c    Config
		want string
	}{
		{"relative state", Config{StatePath: "tessera/cache", Devices: []Device{dev}}, "statePath"},
		{"state with a space", Config{StatePath: "/a b", Devices: []Device{dev}}, "statePath"},
		{"no devices", Config{StatePath: "/s"}, "devices: none"},
		{"too many devices", Config{StatePath: "/s", Devices: many}, "exceed the limit of 16"},
		{"bad uuid", Config{StatePath: "/s", Devices: []Device{{UUID: "GPU-123", MemoryMiB: 1}}}, "devices[0].uuid"},
		{"duplicate uuid", Config{StatePath: "/s", Devices: []Device{dev, {UUID: strings.ToUpper(uuid0[:4]) + strings.ToUpper(uuid0[4:])}}}, "duplicates devices[0]"},
		{"sm over 100", Config{StatePath: "/s", Devices: []Device{{UUID: uuid0, SMPercent: 101}}}, "smPercent 101 outside [0, 100]"},
		{"negative sm", Config{StatePath: "/s", Devices: []Device{{UUID: uuid0, SMPercent: -1}}}, "smPercent -1"},
		{"memory overflows", Config{StatePath: "/s", Devices: []Device{{UUID: uuid0, MemoryMiB: MaxMiB + 1}}}, "memoryMiB"},
		{"reserve overflows", Config{StatePath: "/s", ContextReserveMiB: u64(MaxMiB + 1), Devices: []Device{dev}}, "contextReserveMiB"},
	}
	for _, tc := range cases {
		_, err := Encode(tc.c)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to mention %q", tc.name, err, tc.want)
		}
	}
}

// files: each is accepted or rejected by both parsers, with the same values.
var files = []string{
	"version=1\nstate=/s\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	"# c\n\nversion=1\n#x\nstate=/s\ndevice.0.sm=30\ndevice.0.memory=4096m\ndevice.0.uuid=" + strings.ToUpper(uuid0[:4]) + strings.ToUpper(uuid0[4:]),
	"version=1\nstate=/s=x\nelastic=0\ncontext_reserve=0m\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=0m\ndevice.0.sm=100\ndevice.1.uuid=MIG-" + uuid1[4:] + "\ndevice.1.memory=17592186044415m\ndevice.1.sm=99\n",
	"# comment with spaces and\tcontrol \x01 bytes é\nversion=1\nstate=/s\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0",
	"version=1\nstate=/s\nborrower=0123456789abcdef\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1024m\ndevice.0.sm=0\ndevice.0.ceiling=4096m\ndevice.0.budget=/etc/tessera/burst/" + uuid0 + "\ndevice.1.uuid=" + uuid1 + "\ndevice.1.memory=1m\ndevice.1.sm=0\n",
	"version=1\nstate=/s\nreclaim=/tessera/state/need\nreclaim_wait=1500ms\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	// rejected
	"version=1\nstate=/s\nreclaim=need\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	"version=1\nstate=/s\nreclaim=/" + strings.Repeat("n", 255) + "\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	"version=1\nstate=/s\nreclaim=/n\nreclaim=/n\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	"version=1\nstate=/s\nreclaim_wait=2000\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	"version=1\nstate=/s\nreclaim_wait=60001ms\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	"version=1\nstate=/s\nreclaim_wait=02ms\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	"version=1\nstate=/s\nreclaim_wait=ms\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	"version=1\nstate=/s\nreclaim_wait=1ms\nreclaim_wait=1ms\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	"version=1\nstate=/s\nborrower=0123456789abcdef\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1024m\ndevice.0.sm=0\ndevice.0.ceiling=1024m\ndevice.0.budget=/b\n",
	"version=1\nstate=/s\nborrower=0123456789abcdef\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=0m\ndevice.0.sm=0\ndevice.0.ceiling=1024m\ndevice.0.budget=/b\n",
	"version=1\nstate=/s\nborrower=0123456789abcdef\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\ndevice.0.ceiling=2m\n",
	"version=1\nstate=/s\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\ndevice.0.ceiling=2m\ndevice.0.budget=/b\n",
	"version=1\nstate=/s\nborrower=0123456789abcdef\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\ndevice.0.ceiling=2m\ndevice.0.budget=/" + strings.Repeat("b", 255) + "\n",
	"version=1\nstate=/s\nborrower=0123456789ABCDEF\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	"",
	"# only a comment\n",
	"state=/s\nversion=1\n",
	"version=2\n",
	"version=1\nversion=1\n",
	"version = 1\n",
	"version=1\r\nstate=/s\n",
	"version=1\nstate=s\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	"version=1\nstate=/s\nstate=/t\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	"version=1\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	"version=1\nstate=/s\n",
	"version=1\nstate=/s\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\n",
	"version=1\nstate=/s\ndevice.1.uuid=" + uuid0 + "\ndevice.1.memory=1m\ndevice.1.sm=0\n",
	"version=1\nstate=/s\ndevice.00.uuid=" + uuid0 + "\ndevice.00.memory=1m\ndevice.00.sm=0\n",
	"version=1\nstate=/s\ndevice.16.uuid=" + uuid0 + "\ndevice.16.memory=1m\ndevice.16.sm=0\n",
	"version=1\nstate=/s\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\ndevice.0.sm=0\n",
	"version=1\nstate=/s\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\ndevice.0.shares=4\n",
	"version=1\nstate=/s\ndevice.0.uuid=GPU-6a1f2b3c0d4e-5f60-7182-93a4b5c6d7e8x\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	"version=1\nstate=/s\ndevice.0.uuid=GPU-6a1f2b3c-0d4e-5f60-7182-93a4b5c6d7eg\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	"version=1\nstate=/s\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1024\ndevice.0.sm=0\n",
	"version=1\nstate=/s\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=01m\ndevice.0.sm=0\n",
	"version=1\nstate=/s\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=17592186044416m\ndevice.0.sm=0\n",
	"version=1\nstate=/s\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1g\ndevice.0.sm=0\n",
	"version=1\nstate=/s\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=101\n",
	"version=1\nstate=/s\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=-1\n",
	"version=1\nstate=/s\nelastic=yes\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	"version=1\nstate=/s\ncontext_reserve=5\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	"version=1\nstate=/s\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\ndevice.1.uuid=" + uuid0 + "\ndevice.1.memory=1m\ndevice.1.sm=0\n",
	"version=1\nstate=/s\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\nnoequals\n",
	"version=1\nstate=/s\ndevice.=1\n",
	"version=1\nstate=/s\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\nstate2=/x\n",
	"version=1\nstate=/" + strings.Repeat("a", 4095) + "\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	"version=1\nstate=/" + strings.Repeat("a", 4094) + "\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\n",
	"version=1\nstate=/s\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=0\n#" + strings.Repeat("x", MaxBytes),
}

// canonical renders a parse result as limiter/test/conf_dump.c prints it.
func canonical(c Config, err error) string {
	if err != nil {
		return "error"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "ok\nstate=%s\nelastic=%d\n", c.StatePath, map[bool]int{false: 0, true: 1}[c.Elastic])
	if c.ContextReserveMiB != nil {
		fmt.Fprintf(&b, "context_reserve=%d\n", *c.ContextReserveMiB<<20)
	} else {
		b.WriteString("context_reserve=measured\n")
	}
	for i, d := range c.Devices {
		sm := d.SMPercent
		if sm == 100 {
			sm = 0 // the limiter's "no limit"
		}
		fmt.Fprintf(&b, "device %d %s %d %d\n", i, d.UUID, d.MemoryMiB<<20, sm)
		if d.CeilingMiB != 0 {
			fmt.Fprintf(&b, "ceiling %d %d %s\n", i, d.CeilingMiB<<20, d.BudgetPath)
		}
	}
	if c.Borrower != "" {
		fmt.Fprintf(&b, "borrower=%s\n", c.Borrower)
	}
	if c.ReclaimPath != "" {
		fmt.Fprintf(&b, "reclaim=%s\n", c.ReclaimPath)
	}
	wait := uint64(2000) // the limiter's default
	if c.ReclaimWaitMs != nil {
		wait = *c.ReclaimWaitMs
	}
	fmt.Fprintf(&b, "reclaim_wait=%d\n", wait)
	return b.String()
}

// buildConfDump compiles limiter/test/conf_dump.c with the limiter's own
// parser, so the C side is the one the library runs.
func buildConfDump(t *testing.T) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Fatalf("gcc is required for the parity test: %v", err)
	}
	root := filepath.Join("..", "..", "limiter")
	bin := filepath.Join(t.TempDir(), "conf_dump")
	cmd := exec.Command(gcc, "-O1", "-Wall", "-Werror", "-o", bin, filepath.Join(root, "test", "conf_dump.c"),
		filepath.Join(root, "src", "tl_config.c"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("compiling conf_dump: %v\n%s", err, out)
	}
	return bin
}

func cParse(t *testing.T, bin string, file []byte) string {
	t.Helper()
	return cParseAll(t, bin, [][]byte{file})[0]
}

// cParseAll parses several files with one run of conf_dump.
func cParseAll(t *testing.T, bin string, files [][]byte) []string {
	t.Helper()
	dir := t.TempDir()
	args := make([]string, len(files))
	for i, f := range files {
		args[i] = filepath.Join(dir, fmt.Sprintf("limiter.conf.%d", i))
		if err := os.WriteFile(args[i], f, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(bin, args...).Output()
	if err != nil {
		t.Fatalf("conf_dump: %v", err)
	}
	res := []string{string(out)}
	if len(files) > 1 {
		res = strings.SplitAfter(string(out), "--end--\n")
		res = res[:len(res)-1]
		for i := range res {
			res[i] = strings.TrimSuffix(res[i], "--end--\n")
		}
	}
	if len(res) != len(files) {
		t.Fatalf("conf_dump gave %d results for %d files", len(res), len(files))
	}
	for i, s := range res {
		if strings.HasPrefix(s, "error\n") {
			res[i] = "error"
		}
	}
	return res
}

// TestParityWithC: files Encode writes, and a corpus of valid and invalid
// files, give the same result from Parse and from the limiter's parser.
func TestParityWithC(t *testing.T) {
	bin := buildConfDump(t)
	corpus := append([]string{}, files...)
	for _, c := range []Config{
		sample(),
		{StatePath: "/tessera/state/cache", Devices: []Device{{UUID: uuid0, MemoryMiB: 40960, SMPercent: 0}}},
		{StatePath: "/x", ContextReserveMiB: u64(0), Devices: []Device{{UUID: uuid1, MemoryMiB: 1, SMPercent: 1}}},
		{StatePath: "/x", Borrower: BorrowerName("pod/c"), Devices: []Device{
			{UUID: uuid0, MemoryMiB: 1024, CeilingMiB: 8192, BudgetPath: BudgetDir + "/" + uuid0, SMPercent: 30},
			{UUID: uuid1, MemoryMiB: 1, SMPercent: 1}}},
		{StatePath: "/x", ReclaimPath: "/tessera/state/need", Devices: []Device{{UUID: uuid0, MemoryMiB: 1024}}},
		{StatePath: "/x", ReclaimPath: "/n", ReclaimWaitMs: u64(0), Devices: []Device{{UUID: uuid0, MemoryMiB: 1}}},
		{StatePath: "/x", ReclaimPath: "/n", ReclaimWaitMs: u64(MaxReclaimWaitMs), Devices: []Device{{UUID: uuid0, MemoryMiB: 1}}},
	} {
		b, err := Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		corpus = append(corpus, string(b))
	}
	accepted := 0
	for i, f := range corpus {
		goRes := canonical(Parse([]byte(f)))
		cRes := cParse(t, bin, []byte(f))
		if goRes != cRes {
			t.Errorf("file %d: Go and C disagree\nGo: %s\nC:  %s\nfile: %q", i, goRes, cRes, truncate(f))
		}
		if goRes != "error" {
			accepted++
		}
	}
	if accepted < 7 {
		t.Errorf("only %d files accepted: the corpus must exercise both sides", accepted)
	}
}

func truncate(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

func TestParseErrorsNameTheLine(t *testing.T) {
	_, err := Parse([]byte("version=1\nstate=/s\ndevice.0.uuid=" + uuid0 + "\ndevice.0.memory=1m\ndevice.0.sm=150\n"))
	var pe *ParseError
	if err == nil || !strings.Contains(err.Error(), "line 5") || !strings.Contains(err.Error(), `"150"`) {
		t.Errorf("err = %v, want line 5 and the value", err)
	}
	if err != nil && (!errors.As(err, &pe) || pe.Line != 5) {
		t.Errorf("err %T %v is not a *ParseError for line 5", err, err)
	}
}

// FuzzParse: Parse never panics, and what it accepts round-trips through
// Encode to the same configuration.
func FuzzParse(f *testing.F) {
	for _, s := range files {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if err != nil {
			return
		}
		out, err := Encode(c)
		if err != nil {
			t.Fatalf("Parse accepted what Encode refuses: %v\n%q", err, b)
		}
		c2, err := Parse(out)
		if err != nil || !reflect.DeepEqual(c, c2) {
			t.Fatalf("round trip: %v\n%+v\n%+v", err, c, c2)
		}
		if !bytes.HasPrefix(out, []byte("#")) {
			t.Fatalf("Encode output does not start with its comment: %q", out)
		}
	})
}

// TestParityWithCMutations: deterministic mutations of the accepted files
// (bytes replaced, inserted or deleted, lines dropped or repeated), each
// parsed by both sides; they must agree on every one, accepted or not.
func TestParityWithCMutations(t *testing.T) {
	bin := buildConfDump(t)
	var seeds []string
	for _, f := range files {
		if _, err := Parse([]byte(f)); err == nil {
			seeds = append(seeds, f)
		}
	}
	const alphabet = "0123456789abcdefABCDEFGMIPU-=.m#/\n \t\r\x00\xff"
	rng := rand.New(rand.NewPCG(11, 17))
	n := 3000
	if testing.Short() {
		n = 300
	}
	mutants := make([][]byte, n)
	for i := range mutants {
		b := []byte(seeds[rng.IntN(len(seeds))])
		k := 1 // mostly one mutation, so that many mutants stay close to valid
		if rng.IntN(3) == 0 {
			k += rng.IntN(3)
		}
		for ; k > 0 && len(b) > 0; k-- {
			p := rng.IntN(len(b))
			switch rng.IntN(5) {
			case 0:
				b[p] = alphabet[rng.IntN(len(alphabet))]
			case 1:
				b = append(b[:p], append([]byte{alphabet[rng.IntN(len(alphabet))]}, b[p:]...)...)
			case 2:
				b = append(b[:p], b[p+1:]...)
			default:
				lines := strings.SplitAfter(string(b), "\n")
				j := rng.IntN(len(lines))
				if rng.IntN(2) == 0 {
					lines = append(lines[:j], lines[j+1:]...)
				} else {
					lines = append(lines[:j+1], lines[j:]...)
				}
				b = []byte(strings.Join(lines, ""))
			}
		}
		mutants[i] = b
	}
	accepted := 0
	for i, cRes := range cParseAll(t, bin, mutants) {
		goRes := canonical(Parse(mutants[i]))
		if goRes != cRes {
			t.Errorf("mutant %d: Go and C disagree\nGo: %s\nC:  %s\nfile: %q", i, goRes, cRes, truncate(string(mutants[i])))
		}
		if goRes != "error" {
			accepted++
		}
	}
	if accepted == 0 {
		t.Errorf("no mutant was accepted: the mutations exercise only the error paths")
	}
	t.Logf("%d mutants, %d accepted by both", n, accepted)
}

// TestBudgetParityWithC: budget files EncodeBudget writes are read by the
// limiter's parser, which lends each borrower the unguaranteed memory the
// others leave.
func TestBudgetParityWithC(t *testing.T) {
	bin := buildConfDump(t)
	a, b := BorrowerName("uid-a/main"), BorrowerName("uid-b/main")
	if a == b || len(a) != BorrowerLen || !isBorrower(a) {
		t.Fatalf("BorrowerName gives %q and %q", a, b)
	}
	enc, err := EncodeBudget(Budget{UnguaranteedMiB: 4096, Borrowed: map[string]uint64{a: 1024, b: 512}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "budget")
	if err := os.WriteFile(path, enc, 0o444); err != nil {
		t.Fatal(err)
	}
	for self, want := range map[string]uint64{a: 4096 - 512, b: 4096 - 1024, BorrowerName("other"): 4096 - 1536} {
		out, err := exec.Command(bin, "budget", self, path).Output()
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(out)); got != fmt.Sprintf("ok %d", want<<20) {
			t.Errorf("the limiter lends %s: %q, want %d MiB\n%s", self, got, want, enc)
		}
	}
	if _, err := EncodeBudget(Budget{Borrowed: map[string]uint64{"pod/c": 1}}); err == nil || !strings.Contains(err.Error(), `borrower "pod/c"`) {
		t.Errorf("a raw name: %v, want an error naming it", err)
	}
	many := map[string]uint64{}
	for i := range 600 {
		many[BorrowerName(fmt.Sprint(i))] = 1 << 30
	}
	if _, err := EncodeBudget(Budget{UnguaranteedMiB: 1, Borrowed: many}); err == nil || !strings.Contains(err.Error(), "more than the limiter reads") {
		t.Errorf("600 borrowers: %v, want the size refused", err)
	}
}
