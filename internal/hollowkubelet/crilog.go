package hollowkubelet

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// maxLogLine is the longest line written as one entry; a longer one is
// split into partial ("P") entries, as containerd does at 16 KiB.
const maxLogLine = 16 << 10

// criLog writes a container's stdout and stderr to its log file in the CRI
// format the kubelet reads (`kubectl logs`): one entry per line,
// "<RFC3339Nano time> <stream> <F|P> <line>".
type criLog struct {
	path string
	mu   sync.Mutex
	f    *os.File
}

func openCRILog(path string) (*criLog, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	return &criLog{path: path, f: f}, nil
}

// reopen reopens the file after the kubelet rotated it.
func (l *criLog) reopen() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, err := os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	if l.f != nil {
		l.f.Close()
	}
	l.f = f
	return nil
}

func (l *criLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

func (l *criLog) write(stream runtimeapi.LogStreamType, tag runtimeapi.LogTag, line []byte) {
	var b bytes.Buffer
	b.WriteString(time.Now().UTC().Format(time.RFC3339Nano))
	b.WriteByte(' ')
	b.WriteString(string(stream))
	b.WriteByte(' ')
	b.WriteString(string(tag))
	b.WriteByte(' ')
	b.Write(line)
	b.WriteByte('\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		_, _ = l.f.Write(b.Bytes())
	}
}

// copy reads one stream until it ends and writes it line by line; a last
// line without a newline is written as a full line when the stream ends.
func (l *criLog) copy(stream runtimeapi.LogStreamType, r io.Reader) {
	buf := make([]byte, 0, maxLogLine)
	chunk := make([]byte, 32<<10)
	for {
		n, err := r.Read(chunk)
		data := chunk[:n]
		for len(data) > 0 {
			i := bytes.IndexByte(data, '\n')
			if i < 0 {
				room := maxLogLine - len(buf)
				if len(data) < room {
					buf = append(buf, data...)
					break
				}
				buf = append(buf, data[:room]...)
				l.write(stream, runtimeapi.LogTagPartial, buf)
				buf = buf[:0]
				data = data[room:]
				continue
			}
			line := data[:i]
			for len(buf)+len(line) > maxLogLine {
				room := maxLogLine - len(buf)
				buf = append(buf, line[:room]...)
				l.write(stream, runtimeapi.LogTagPartial, buf)
				buf = buf[:0]
				line = line[room:]
			}
			buf = append(buf, line...)
			l.write(stream, runtimeapi.LogTagFull, buf)
			buf = buf[:0]
			data = data[i+1:]
		}
		if err != nil {
			if len(buf) > 0 {
				l.write(stream, runtimeapi.LogTagFull, buf)
			}
			return
		}
	}
}
