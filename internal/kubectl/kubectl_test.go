package kubectl

import (
	"os"
	"reflect"
	"testing"

	"github.com/kelp-dev/kelp/internal/layout"
)

func TestWithDefaultKubeconfig(t *testing.T) {
	_, statErr := os.Stat(layout.Kubeconfig)
	def := []string{"--kubeconfig=" + layout.Kubeconfig, "get", "pods"}
	if statErr != nil {
		def = []string{"get", "pods"} // no kelp server has written it on this machine
	}
	tests := []struct {
		name string
		args []string
		env  string
		want []string
	}{
		{"default", []string{"get", "pods"}, "", def},
		{"env wins", []string{"get", "pods"}, "/x", []string{"get", "pods"}},
		{"flag wins", []string{"--kubeconfig", "/y", "get"}, "", []string{"--kubeconfig", "/y", "get"}},
		{"flag= wins", []string{"get", "--kubeconfig=/y"}, "", []string{"get", "--kubeconfig=/y"}},
	}
	for _, tt := range tests {
		if got := withDefaultKubeconfig(tt.args, tt.env); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: got %v want %v", tt.name, got, tt.want)
		}
	}
}
