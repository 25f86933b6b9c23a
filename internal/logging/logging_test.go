package logging

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"k8s.io/klog/v2"
)

func TestKlogGoesThroughLogrus(t *testing.T) {
	var buf bytes.Buffer
	Setup(false)
	logrus.SetOutput(&buf)
	klog.InfoS("apiserver started", "port", 6443)
	klog.V(2).InfoS("chatty detail")
	klog.ErrorS(errors.New("boom"), "watch failed", "resource", "pods")
	klog.Flush()
	out := buf.String()
	for _, want := range []string{`level=info msg="apiserver started"`, "port=6443", "component=k8s", `level=error msg="watch failed"`, "error=boom", "resource=pods"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "chatty detail") {
		t.Errorf("verbose klog output must stay out at Info:\n%s", out)
	}

	buf.Reset()
	logrus.Info("COMPACT compacted from 1 to 2")         // a library without a component
	logrus.Warn("library warning")                       // still shown
	logrus.WithField("component", "pki").Info("created") // kelp's own
	out = buf.String()
	if strings.Contains(out, "COMPACT") || !strings.Contains(out, "library warning") || !strings.Contains(out, "created") {
		t.Errorf("library Info lines must be hidden, everything else shown:\n%s", out)
	}

	buf.Reset()
	Setup(true)
	logrus.SetOutput(&buf)
	klog.V(2).InfoS("chatty detail")
	klog.Flush()
	logrus.Info("COMPACT compacted from 1 to 2")
	if !strings.Contains(buf.String(), `level=debug msg="chatty detail"`) || !strings.Contains(buf.String(), "COMPACT") {
		t.Errorf("with debug on, verbose klog output and library Info lines show:\n%s", buf.String())
	}
}

// Lines for the journal carry no time of their own and, like every line
// not written to a terminal, no colour codes.
func TestTextFormatterForTheJournal(t *testing.T) {
	entry := logrus.NewEntry(logrus.New()).WithField("component", "server")
	entry.Message, entry.Level = "kelp server is ready", logrus.InfoLevel
	for _, journal := range []bool{false, true} {
		out, err := textFormatter(journal).Format(entry)
		if err != nil {
			t.Fatal(err)
		}
		line := string(out)
		if strings.Contains(line, "\x1b[") {
			t.Errorf("journal=%v: colour codes in %q", journal, line)
		}
		if strings.Contains(line, "time=") == journal {
			t.Errorf("journal=%v: %q", journal, line)
		}
	}
}
