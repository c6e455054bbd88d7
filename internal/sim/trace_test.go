package sim

import (
	"fmt"
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
