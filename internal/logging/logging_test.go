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
	Setup(true)
	logrus.SetOutput(&buf)
	klog.V(2).InfoS("chatty detail")
	klog.Flush()
	if !strings.Contains(buf.String(), `level=debug msg="chatty detail"`) {
		t.Errorf("with debug on, verbose klog output is debug:\n%s", buf.String())
	}
}
