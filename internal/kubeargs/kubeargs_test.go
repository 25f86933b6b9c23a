package kubeargs

import (
	"reflect"
	"testing"
)

func TestRender(t *testing.T) {
	got := Render(map[string]string{"b": "1", "a": "x=y", "leader-elect": "true"},
		[]string{"leader-elect=false", "--v=2", "c=", "v=4"})
	want := []string{"--a=x=y", "--b=1", "--c=", "--leader-elect=false", "--v=4"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
}
