package clusterview

import (
	"bytes"
	"strings"
	"testing"
)

// TestTopClaims: a DRA claim's series (the node agent's claim label) is
// its own row, named by the claim where it has no pod, with the claim in
// -o wide.
func TestTopClaims(t *testing.T) {
	const scrape = `# TYPE tessera_container_memory_limit_bytes gauge
tessera_container_memory_limit_bytes{gpu="0",UUID="GPU-a",Hostname="lab-dra",namespace="ml",pod="",container="",claim="shared"} 1.073741824e+10
tessera_container_memory_limit_bytes{gpu="0",UUID="GPU-a",Hostname="lab-dra",namespace="ml",pod="train",container="main",claim=""} 2.147483648e+10
# TYPE tessera_container_memory_used_bytes gauge
tessera_container_memory_used_bytes{gpu="0",UUID="GPU-a",Hostname="lab-dra",namespace="ml",pod="",container="",claim="shared"} 5.36870912e+09
`
	rows, err := ParseTop(strings.NewReader(scrape))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 {
		t.Fatalf("rows %+v, want 2", rows)
	}
	var out bytes.Buffer
	if err := PrintTop(&out, rows, "ml", OutputWide); err != nil {
		t.Fatal(err)
	}
	want := `NAMESPACE  POD           CONTAINER  NODE     GPU  MEMORY USED/LIMIT (MiB)  MEMORY %  SM USE/SHARE  UUID   CLAIM
ml         claim shared  -          lab-dra  0    5120/10240               50%       -/0%          GPU-a  shared
ml         train         main       lab-dra  0    0/20480                  0%        -/0%          GPU-a  -
`
	if out.String() != want {
		t.Errorf("top -o wide:\n%s\nwant:\n%s", out.String(), want)
	}
}
