package sim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const nodeHeader = "sn,cpu_milli,memory_mib,gpu,model\n"
const podHeader = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"

func TestParseErrorsNameFileAndLine(t *testing.T) {
	cases := []struct {
		name, input, want string
		nodes             bool
	}{
		{"missing column", "sn,cpu_milli,gpu,model\nn1,1000,2,T4\n", `nodes.csv:1: missing column "memory_mib"`, true},
		{"non-numeric", nodeHeader + "n1,1000,4096,2,T4\nn2,lots,4096,2,T4\n", `nodes.csv:3: cpu_milli "lots" is not an integer`, true},
		{"negative", nodeHeader + "n1,-5,4096,2,T4\n", "nodes.csv:2: cpu_milli -5 is negative", true},
		{"too many GPUs", nodeHeader + "n1,1000,4096,65,T4\n", "nodes.csv:2: gpu 65 exceeds the limit 64", true},
		{"duplicate node", nodeHeader + "n1,1000,4096,2,T4\nn1,1000,4096,2,T4\n", "nodes.csv:3: node n1 already defined on line 2", true},
		{"negative pod memory", podHeader + "p1,1000,-1,1,500,,LS,Running,0,0,0\n", "pods.csv:2: memory_mib -1 is negative", false},
		{"share above a GPU", podHeader + "p1,1000,10,1,1500,,LS,Running,0,0,0\n", "pods.csv:2: gpu_milli 1500 exceeds the limit 1000", false},
		{"partial multi-GPU", podHeader + "p1,1000,10,2,500,,LS,Running,0,0,0\n", "pods.csv:2: num_gpu 2 with gpu_milli 500", false},
		{"short row", podHeader + "p1,1000\n", "pods.csv:2: row has 2 fields", false},
		{"empty file", "", "pods.csv: empty file", false},
	}
	for _, c := range cases {
		var err error
		if c.nodes {
			_, err = ParseNodes(strings.NewReader(c.input), "nodes.csv")
		} else {
			_, err = ParsePods(strings.NewReader(c.input), "pods.csv")
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.want)
		}
	}
}

func TestParsePodsMapsRows(t *testing.T) {
	pods, err := ParsePods(strings.NewReader(podHeader+
		"p1,1000,2048,0,0,,LS,Running,0,0,0\n"+
		"p2,2000,4096,1,455,A10|T4,LS,Running,0,0,0\n"+
		"p3,3000,8192,4,1000,,LS,Running,0,0,0\n"), "pods.csv")
	if err != nil {
		t.Fatal(err)
	}
	r := Request(pods[1], "k")
	if len(r.Containers) != 1 || r.Containers[0].Cores != 46 || r.Containers[0].MemoryPercent != 46 {
		t.Errorf("share of 455m: %+v, want one container with 46%% (rounded up)", r.Containers)
	}
	if len(r.IncludeModels) != 2 || r.IncludeModels[0] != "A10" || r.IncludeModels[1] != "T4" {
		t.Errorf("gpu_spec A10|T4: IncludeModels %v", r.IncludeModels)
	}
	if r := Request(pods[0], "k"); len(r.Containers) != 0 || r.CPUMilli != 1000 || r.MemoryMiB != 2048 {
		t.Errorf("CPU-only task: %+v", r)
	}
	if r := Request(pods[2], "k"); r.Containers[0].GPUs != 4 || !r.Containers[0].Exclusive() {
		t.Errorf("4 whole GPUs: %+v", r.Containers)
	}
}

func TestParseSeeds(t *testing.T) {
	cases := map[string]string{"3": "[1 2 3]", "4-6": "[4 5 6]", "1,5,7-8": "[1 5 7 8]"}
	for in, want := range cases {
		got, err := ParseSeeds(in)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if s := fmt.Sprint(got); s != want {
			t.Errorf("%q: %v, want %s", in, got, want)
		}
	}
	for _, bad := range []string{"0", "x", "5-2", "1-100000"} {
		if _, err := ParseSeeds(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// Some published openb variant pod lists carry only the five columns the
// method needs: they load, and an absent gpu_spec means no model
// constraint. Columns may come in any order.
func TestParsePodsWithOnlyTheNeededColumns(t *testing.T) {
	pods, err := ParsePods(strings.NewReader("gpu_milli,num_gpu,name,cpu_milli,memory_mib\n"+
		"1000,2,p1,8000,16384\n500,1,p2,4000,8192\n0,0,p3,2000,1024\n"), "pods.csv")
	if err != nil {
		t.Fatal(err)
	}
	want := []PodRow{
		{Name: "p1", CPUMilli: 8000, MemMiB: 16384, NumGPU: 2, GPUMilli: 1000},
		{Name: "p2", CPUMilli: 4000, MemMiB: 8192, NumGPU: 1, GPUMilli: 500},
		{Name: "p3", CPUMilli: 2000, MemMiB: 1024},
	}
	if fmt.Sprint(pods) != fmt.Sprint(want) {
		t.Errorf("pods %+v, want %+v", pods, want)
	}
	if r := Request(pods[1], "k"); r.IncludeModels != nil {
		t.Errorf("no gpu_spec column: IncludeModels %v, want none", r.IncludeModels)
	}
	// A required column is still required, and the error lists them.
	_, err = ParsePods(strings.NewReader("name,cpu_milli,memory_mib,num_gpu\np1,1,1,0\n"), "pods.csv")
	if err == nil || !strings.Contains(err.Error(), `pods.csv:1: missing column "gpu_milli" (want name,cpu_milli,memory_mib,num_gpu,gpu_milli)`) {
		t.Errorf("missing gpu_milli: error %v", err)
	}
}

// A node list without the model column loads (no node has a model); a pod
// list that names models with it is refused, naming the pod.
func TestLoadTraceWithoutModels(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	nodes := write("nodes.csv", "sn,cpu_milli,memory_mib,gpu\na,32000,65536,2\nb,32000,65536,2\n")
	pods := write("pods.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1024,1,500\np2,1000,1024,1,1000\np3,1000,1024,0,0\n")
	tr, err := LoadTrace(nodes, pods)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Nodes[0].Model != "" || tr.Nodes[0].GPUs != 2 {
		t.Errorf("node %+v, want 2 GPUs and no model", tr.Nodes[0])
	}
	cv, err := Run(tr, "tessera", 1)
	if err != nil {
		t.Fatal(err)
	}
	// Up to arrived = 100% every task fits (a 500m share, a whole GPU,
	// CPU-only tasks on four GPUs): nothing dropped, without models.
	for k := range cv.Arrived {
		if cv.Arrived[k] <= cv.Capacity && cv.Allocated[k] != cv.Arrived[k] {
			t.Fatalf("arrival %d: %dm allocated of %dm arrived, want all", k, cv.Allocated[k], cv.Arrived[k])
		}
	}
	spec := write("spec.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np1,1000,1024,1,500,T4\n")
	if _, err := LoadTrace(nodes, spec); err == nil || !strings.Contains(err.Error(), `pod p1 has gpu_spec "T4" but no node has a model`) {
		t.Errorf("gpu_spec without node models: error %v", err)
	}
}
