package hollowkubelet

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/logs"
)

// TestCRILogReadByTheKubelet: what the runtime writes, the kubelet's own
// log reader (`kubectl logs`) gives back byte for byte, per stream: lines,
// a line longer than an entry, and a last line without a newline.
func TestCRILogReadByTheKubelet(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c", "0.log")
	l, err := openCRILog(path)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 3*maxLogLine+7)
	stdout := "first line\n\n" + long + "\nlast without newline"
	stderr := "an error\n"
	// Written in pieces that split lines, as a pipe delivers them.
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() { l.copy(runtimeapi.Stdout, pr); close(done) }()
	for i := 0; i < len(stdout); i += 1000 {
		_, _ = pw.Write([]byte(stdout[i:min(i+1000, len(stdout))]))
	}
	pw.Close()
	<-done
	l.copy(runtimeapi.Stderr, strings.NewReader(stderr))
	l.close()

	var gotOut, gotErr bytes.Buffer
	if err := logs.ReadLogs(context.Background(), path, "c", &logs.LogOptions{}, nil, &gotOut, &gotErr); err != nil {
		t.Fatal(err)
	}
	if gotOut.String() != stdout+"\n" {
		t.Errorf("stdout read back: %d bytes, want %d (the input and a newline after its last line)", gotOut.Len(), len(stdout)+1)
	}
	if gotErr.String() != stderr {
		t.Errorf("stderr read back %q, want %q", gotErr.String(), stderr)
	}
}
