package kubeargs

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/internal/testlog"
)

func TestRender(t *testing.T) {
	got := Render(map[string]string{"b": "1", "a": "x=y", "leader-elect": "true"},
		[]string{"leader-elect=false", "--v=2", "c=", "v=4"})
	want := []string{"--a=x=y", "--b=1", "--c=", "--leader-elect=false", "--v=4"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
}

func TestRenderAddsFeatureGates(t *testing.T) {
	got := Render(map[string]string{"feature-gates": "KelpNeeds=true"},
		[]string{"feature-gates=Mine=true", "--feature-gates=KelpNeeds=false"})
	want := []string{"--feature-gates=KelpNeeds=true,Mine=true,KelpNeeds=false"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
	if got := Render(map[string]string{}, []string{"feature-gates=Mine=true"}); !reflect.DeepEqual(got, []string{"--feature-gates=Mine=true"}) {
		t.Errorf("without gates of kelp's: got %v", got)
	}
}

func TestLog(t *testing.T) {
	hook := testlog.Capture(t)
	level := logrus.GetLevel()
	logrus.SetLevel(logrus.DebugLevel)
	t.Cleanup(func() { logrus.SetLevel(level) })

	args := []string{"--config=/data dir/kubelet.yaml", `--node-labels=a="b"`}
	Log("kubelet", args)

	e := hook.LastEntry()
	if e == nil || e.Level != logrus.DebugLevel || e.Message != "command line" || e.Data["component"] != "kubelet" {
		t.Fatalf("logged %+v, want a Debug command line of the kubelet", e)
	}
	var got []string
	if err := json.Unmarshal([]byte(e.Data["args"].(string)), &got); err != nil {
		t.Fatalf("args field %q: %v", e.Data["args"], err)
	}
	if !reflect.DeepEqual(got, args) {
		t.Errorf("args decode to %q, want %q", got, args)
	}
}
