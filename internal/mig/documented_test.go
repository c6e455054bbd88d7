package mig

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/api"
)

// documented is NVIDIA's table for each model, written the way
// `nvidia-smi mig -lgip` (profile ID, name, instances, SMs) and
// `nvidia-smi mig -lgipp` (placements as {starts}:size) print it, from the
// MIG user guide ("Supported MIG Profiles"). The tests compare the package's
// tables with these lines, so a typo in either shows.
var documented = map[string]string{
	"A100-40GB": `
19 1g.5gb     7 14 {0,1,2,3,4,5,6}:1
20 1g.5gb+me  1 14 {0,1,2,3,4,5,6}:1
15 1g.10gb    4 14 {0,2,4,6}:2
14 2g.10gb    3 28 {0,2,4}:2
9  3g.20gb    2 42 {0,4}:4
5  4g.20gb    1 56 {0}:4
0  7g.40gb    1 98 {0}:8`,
	"A100-80GB": `
19 1g.10gb    7 14 {0,1,2,3,4,5,6}:1
20 1g.10gb+me 1 14 {0,1,2,3,4,5,6}:1
15 1g.20gb    4 14 {0,2,4,6}:2
14 2g.20gb    3 28 {0,2,4}:2
9  3g.40gb    2 42 {0,4}:4
5  4g.40gb    1 56 {0}:4
0  7g.80gb    1 98 {0}:8`,
	"H100-80GB": `
19 1g.10gb    7 16 {0,1,2,3,4,5,6}:1
20 1g.10gb+me 1 16 {0,1,2,3,4,5,6}:1
15 1g.20gb    4 26 {0,2,4,6}:2
14 2g.20gb    3 32 {0,2,4}:2
9  3g.40gb    2 60 {0,4}:4
5  4g.40gb    1 64 {0}:4
0  7g.80gb    1 132 {0}:8`,
	"H200-141GB": `
19 1g.18gb    7 16 {0,1,2,3,4,5,6}:1
20 1g.18gb+me 1 16 {0,1,2,3,4,5,6}:1
15 1g.35gb    4 26 {0,2,4,6}:2
14 2g.35gb    3 32 {0,2,4}:2
9  3g.71gb    2 60 {0,4}:4
5  4g.71gb    1 64 {0}:4
0  7g.141gb   1 132 {0}:8`,
	"A30-24GB": `
14 1g.6gb     4 14 {0,1,2,3}:1
21 1g.6gb+me  1 14 {0,1,2,3}:1
5  2g.12gb    2 28 {0,2}:2
6  2g.12gb+me 1 28 {0,2}:2
0  4g.24gb    1 56 {0}:4`,
}

func TestTablesMatchDocumentation(t *testing.T) {
	if len(documented) != len(Models) {
		t.Fatalf("%d models in the package, %d documented", len(Models), len(documented))
	}
	for name, doc := range documented {
		m, ok := ModelByName(name)
		if !ok {
			t.Errorf("model %s missing", name)
			continue
		}
		lines := strings.Split(strings.TrimSpace(doc), "\n")
		if len(lines) != len(m.Profiles) {
			t.Errorf("%s: %d profiles, documented %d", name, len(m.Profiles), len(lines))
		}
		for _, line := range lines {
			var id, inst, sms int
			var pname, place string
			if _, err := fmt.Sscan(line, &id, &pname, &inst, &sms, &place); err != nil {
				t.Fatalf("%s: bad documented line %q: %v", name, line, err)
			}
			p, ok := m.Profile(pname)
			if !ok {
				t.Errorf("%s: profile %s missing", name, pname)
				continue
			}
			got := fmt.Sprintf("%d %d %d %s", p.ID, p.MaxInstances, p.SMs, placements(p))
			want := fmt.Sprintf("%d %d %d %s", id, inst, sms, place)
			if got != want {
				t.Errorf("%s %s: ID/instances/SMs/placements %q, documented %q", name, pname, got, want)
			}
			if p.Media != strings.HasSuffix(pname, "+me") {
				t.Errorf("%s %s: media %v", name, pname, p.Media)
			}
			c, _, _, err := api.ParseMIGProfile(pname)
			if err != nil || c != p.Compute {
				t.Errorf("%s %s: compute slices %d, name says %d (%v)", name, pname, p.Compute, c, err)
			}
		}
		total := 0
		for _, p := range m.Profiles {
			if p.MemorySlices == m.MemorySlices && p.Compute == m.ComputeSlices {
				total++
			}
		}
		if total != 1 {
			t.Errorf("%s: %d profiles span the whole GPU, want 1", name, total)
		}
	}
}

func placements(p *Profile) string {
	s := make([]string, len(p.Starts))
	for i, x := range p.Starts {
		s[i] = fmt.Sprint(x)
	}
	return fmt.Sprintf("{%s}:%d", strings.Join(s, ","), p.MemorySlices)
}
