package crictl

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/urfave/cli/v2"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// followPoll is how often logs -f looks for more of the file.
const followPoll = 250 * time.Millisecond

// logs prints a container's log from the file the runtime writes, in the
// CRI log format, as crictl logs does: stdout lines to stdout, stderr
// lines to stderr.
func logs(ctx context.Context, c *cli.Context, cl clients) error {
	if c.NArg() != 1 {
		return fmt.Errorf("give one CONTAINER-ID (kelp crictl ps -a lists them)")
	}
	id := c.Args().First()
	status, err := containerStatus(ctx, cl, id)
	if err != nil {
		return err
	}
	if status.LogPath == "" {
		return fmt.Errorf("container %s has no log file", id)
	}
	out := logWriter{stdout: c.App.Writer, stderr: c.App.ErrWriter, timestamps: c.Bool("timestamps")}
	// The path is the node's: in a mount namespace of its own, it is
	// reached through its root.
	path := cl.node.Path(status.LogPath)
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("container %s: %w", id, err)
	}
	defer func() { f.Close() }()
	rest, err := tailFrom(f, c.Int("tail"))
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if err := out.copy(rest); err != nil || !c.Bool("follow") {
		return err
	}
	// Follow: the runtime appends; the kubelet rotates the file by renaming
	// it and having the runtime reopen the path, so a new file at the path
	// is read from its start.
	reader := bufio.NewReader(f)
	for {
		line, err := reader.ReadBytes('\n')
		if len(line) > 0 && line[len(line)-1] == '\n' {
			if err := out.write(line); err != nil {
				return err
			}
			continue
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read %s: %w", path, err)
		}
		// An unfinished line is read again whole once it ends.
		if _, err := f.Seek(-int64(len(line)), io.SeekCurrent); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(followPoll):
		}
		if rotated(f, path) {
			next, err := os.Open(path)
			if err == nil {
				f.Close()
				f = next
			}
		} else if st, err := containerStatus(ctx, cl, id); err != nil || st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			// What an exited container wrote is all there is, once read.
			if pos, _ := f.Seek(0, io.SeekCurrent); atEnd(f, pos) {
				return nil
			}
		}
		reader.Reset(f)
	}
}

func containerStatus(ctx context.Context, cl clients, id string) (*runtimeapi.ContainerStatus, error) {
	ctx, cancel := cl.call(ctx)
	defer cancel()
	resp, err := cl.runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return nil, lookupError(err, "container", id, "ps -a")
	}
	return resp.Status, nil
}

// rotated says whether path is no longer the file f.
func rotated(f *os.File, path string) bool {
	now, err := os.Stat(path)
	if err != nil {
		return false
	}
	open, err := f.Stat()
	return err == nil && !os.SameFile(open, now)
}

func atEnd(f *os.File, pos int64) bool {
	st, err := f.Stat()
	return err == nil && st.Size() <= pos
}

// tailFrom reads f to its end and returns its last n complete log entries
// (all with n < 0), leaving f at the end of the last complete line.
func tailFrom(f *os.File, n int) ([]byte, error) {
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	complete := data[:bytes.LastIndexByte(data, '\n')+1]
	if _, err := f.Seek(int64(len(complete)-len(data)), io.SeekCurrent); err != nil {
		return nil, err
	}
	if n < 0 {
		return complete, nil
	}
	// An entry is the partial lines (tag P) before a line that ends it:
	// the wanted entries start after the (n+1)th such line from the end.
	lines := bytes.SplitAfter(complete, []byte("\n"))
	ends := 0
	for i := len(lines) - 1; i >= 0; i-- {
		if l, err := parseLogLine(lines[i]); len(lines[i]) > 0 && (err != nil || !l.partial) {
			ends++
			if ends == n+1 {
				return bytes.Join(lines[i+1:], nil), nil
			}
		}
	}
	return complete, nil
}

// logLine is one line of the CRI log format:
// "2024-01-02T03:04:05.123456789Z stdout F the text".
type logLine struct {
	time    time.Time
	stream  string
	partial bool // tag P: the entry goes on in the next line
	content []byte
}

func parseLogLine(line []byte) (logLine, error) {
	line = bytes.TrimSuffix(line, []byte("\n"))
	fields := bytes.SplitN(line, []byte(" "), 4)
	if len(fields) < 3 {
		return logLine{}, fmt.Errorf("not a CRI log line: %q", line)
	}
	t, err := time.Parse(time.RFC3339Nano, string(fields[0]))
	if err != nil {
		return logLine{}, fmt.Errorf("not a CRI log line: %q", line)
	}
	l := logLine{time: t, stream: string(fields[1]), partial: string(fields[2]) == "P"}
	if len(fields) == 4 {
		l.content = fields[3]
	}
	return l, nil
}

// logWriter prints log lines' contents to the stream they came from.
type logWriter struct {
	stdout, stderr io.Writer
	timestamps     bool
}

func (w logWriter) copy(data []byte) error {
	for len(data) > 0 {
		end := bytes.IndexByte(data, '\n') + 1
		if err := w.write(data[:end]); err != nil {
			return err
		}
		data = data[end:]
	}
	return nil
}

func (w logWriter) write(line []byte) error {
	l, err := parseLogLine(line)
	if err != nil {
		return err
	}
	out := w.stdout
	if l.stream == "stderr" {
		out = w.stderr
	}
	var b bytes.Buffer
	if w.timestamps {
		b.WriteString(l.time.Format(time.RFC3339Nano) + " ")
	}
	b.Write(l.content)
	if !l.partial {
		b.WriteByte('\n')
	}
	_, err = out.Write(b.Bytes())
	return err
}
