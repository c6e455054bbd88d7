package labdir

import (
	"bytes"
	"testing"

	"k8s.io/klog/v2/textlogger"
)

// TestLogLine: LogLine matches what a named klog logger writes (the node
// agent's "node-agent" logger puts logger="node-agent" between the
// message and its values) and not another message, other values, values
// out of order, or values on another line.
func TestLogLine(t *testing.T) {
	var buf bytes.Buffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf))).WithName("node-agent")
	logger.Info("Created a MIG instance", "pod", "vmig/mig", "container", "main", "gpu", "GPU-1", "instance", "2g.10gb@0", "device", "MIG-2")
	logger.Info("Destroyed a MIG instance no pod holds", "gpu", "GPU-1", "instance", "1g.5gb@6")
	log := buf.Bytes()
	t.Logf("log:\n%s", log)
	for _, c := range []struct {
		msg  string
		kv   []string
		want bool
	}{
		{"Created a MIG instance", []string{"pod", "vmig/mig", "instance", "2g.10gb@0"}, true},
		{"Created a MIG instance", nil, true},
		{"Destroyed a MIG instance no pod holds", []string{"gpu", "GPU-1", "instance", "1g.5gb@6"}, true},
		{"Created a MIG instance", []string{"pod", "vmig/other"}, false},
		{"Created a MIG instance", []string{"instance", "2g.10gb@0", "pod", "vmig/mig"}, false},
		{"Created a MIG", nil, false},
		{"Destroyed a MIG instance no pod holds", []string{"instance", "2g.10gb@0"}, false},
		{"Created a MIG instance", []string{"instance", "1g.5gb@6"}, false},
	} {
		if got := LogLine(c.msg, c.kv...).Match(log); got != c.want {
			t.Errorf("LogLine(%q, %q) matches: %v, want %v", c.msg, c.kv, got, c.want)
		}
	}
}
