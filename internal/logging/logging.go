package logging

import (
	"flag"
	"fmt"
	"os"
	"strconv"

	"github.com/go-logr/logr"
	"github.com/sirupsen/logrus"
	"k8s.io/klog/v2"
)

// Setup configures logrus and routes klog into it. Call it once, from main.
// klog's level 0 becomes Info; its verbose levels become Debug and are only
// produced with debug on, so a steady node stays quiet at Info.
func Setup(debug bool) {
	logrus.SetOutput(os.Stderr)
	var text logrus.Formatter = textFormatter(os.Getenv("JOURNAL_STREAM") != "")
	logrus.SetFormatter(quietLibraries{text})
	logrus.SetLevel(logrus.InfoLevel)
	verbosity := 0
	if debug {
		logrus.SetFormatter(text)
		logrus.SetLevel(logrus.DebugLevel)
		verbosity = 2
	}
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("v", strconv.Itoa(verbosity))
	RouteKlog()
}

// textFormatter writes key=value lines, coloured only on a terminal. Under
// systemd (journal: stderr goes to the journal, which stamps each line
// itself) the lines carry no time of their own.
func textFormatter(journal bool) logrus.Formatter {
	return &logrus.TextFormatter{FullTimestamp: true, DisableTimestamp: journal}
}

// RouteKlog sends klog's output to logrus. Setup does it; call it again
// after a library took klog over (CoreDNS's kubernetes plugin does at
// every configuration load).
func RouteKlog() {
	klog.SetLogger(logr.New(&sink{entry: logrus.WithField("component", "k8s")}))
}

// quietLibraries drops the Info lines of libraries that log through
// logrus's global logger without a component field — kine logs every
// compaction at Info, every 5 minutes on an idle server. kelp's own
// loggers always carry a component; warnings and errors always pass.
type quietLibraries struct {
	logrus.Formatter
}

func (f quietLibraries) Format(e *logrus.Entry) ([]byte, error) {
	if _, ok := e.Data["component"]; !ok && e.Level == logrus.InfoLevel {
		return nil, nil
	}
	return f.Formatter.Format(e)
}

// sink is a logr.LogSink writing to logrus.
type sink struct {
	entry *logrus.Entry
}

func (s *sink) Init(logr.RuntimeInfo) {}

func (s *sink) Enabled(level int) bool {
	if level == 0 {
		return s.entry.Logger.IsLevelEnabled(logrus.InfoLevel)
	}
	return s.entry.Logger.IsLevelEnabled(logrus.DebugLevel)
}

func (s *sink) Info(level int, msg string, kv ...any) {
	e := s.entry.WithFields(fields(kv))
	if level == 0 {
		e.Info(msg)
		return
	}
	e.Debug(msg)
}

func (s *sink) Error(err error, msg string, kv ...any) {
	e := s.entry.WithFields(fields(kv))
	if err != nil {
		e = e.WithError(err)
	}
	e.Error(msg)
}

func (s *sink) WithValues(kv ...any) logr.LogSink {
	return &sink{entry: s.entry.WithFields(fields(kv))}
}

func (s *sink) WithName(name string) logr.LogSink {
	if prev, ok := s.entry.Data["logger"].(string); ok {
		name = prev + "/" + name
	}
	return &sink{entry: s.entry.WithField("logger", name)}
}

func fields(kv []any) logrus.Fields {
	f := make(logrus.Fields, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		f[fmt.Sprint(kv[i])] = kv[i+1]
	}
	return f
}
