package crictl

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

const sampleLog = `2026-11-23T10:00:00.000000001Z stdout F one
2026-11-23T10:00:01.000000002Z stderr F two
2026-11-23T10:00:02.000000003Z stdout P thr
2026-11-23T10:00:02.000000004Z stdout F ee
2026-11-23T10:00:03.000000005Z stdout F four
2026-11-23T10:00:04.000000006Z stdout F unfini`

func TestTailAndWrite(t *testing.T) {
	for _, tc := range []struct {
		name             string
		tail             int
		timestamps       bool
		stdout, stderr   string
		unreadAfterwards string
	}{
		{name: "all", tail: -1, stdout: "one\nthree\nfour\n", stderr: "two\n"},
		{name: "last entry", tail: 1, stdout: "four\n"},
		{name: "a partial entry counts once", tail: 2, stdout: "three\nfour\n"},
		{name: "more than there are", tail: 10, stdout: "one\nthree\nfour\n", stderr: "two\n"},
		{name: "timestamps", tail: 1, timestamps: true, stdout: "2026-11-23T10:00:03.000000005Z four\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "0.log")
			if err := os.WriteFile(path, []byte(sampleLog), 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			data, err := tailFrom(f, tc.tail)
			if err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			if err := (logWriter{stdout: &stdout, stderr: &stderr, timestamps: tc.timestamps}).copy(data); err != nil {
				t.Fatal(err)
			}
			if stdout.String() != tc.stdout || stderr.String() != tc.stderr {
				t.Errorf("stdout %q stderr %q, want %q and %q", stdout.String(), stderr.String(), tc.stdout, tc.stderr)
			}
			// The unfinished last line is left for -f to read whole.
			rest := make([]byte, 100)
			n, _ := f.Read(rest)
			if got := string(rest[:n]); got != "2026-11-23T10:00:04.000000006Z stdout F unfini" {
				t.Errorf("left unread %q, want the unfinished line", got)
			}
		})
	}
}

func TestParseLogLine(t *testing.T) {
	l, err := parseLogLine([]byte("2026-11-23T10:00:00.5Z stderr P a b c\n"))
	if err != nil || l.stream != "stderr" || !l.partial || string(l.content) != "a b c" {
		t.Errorf("got %+v, %v", l, err)
	}
	if l, err := parseLogLine([]byte("2026-11-23T10:00:00Z stdout F\n")); err != nil || len(l.content) != 0 {
		t.Errorf("an empty line: %+v, %v", l, err)
	}
	for _, bad := range []string{"", "hello world", "yesterday stdout F x"} {
		if _, err := parseLogLine([]byte(bad)); err == nil {
			t.Errorf("%q parsed as a log line", bad)
		}
	}
}
