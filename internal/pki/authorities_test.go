package pki

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A joining server issues its own leaves from the cluster's authorities,
// so they verify against the first server's CAs.
func TestAuthoritiesJoin(t *testing.T) {
	first := testConfig(t)
	files, _ := run(t, first)
	a, err := ReadAuthorities(files)
	if err != nil {
		t.Fatal(err)
	}
	second := testConfig(t)
	second.Hostname = "server-2"
	if err := WriteAuthorities(second.Dir, a); err != nil {
		t.Fatal(err)
	}
	joined, _ := run(t, second)
	for _, p := range [][2]string{{files.ServerCA.Cert, joined.ServerCA.Cert}, {files.EtcdPeerCA.Key, joined.EtcdPeerCA.Key}, {files.KubeletCA.Key, joined.KubeletCA.Key}, {files.ServiceAccountKey, joined.ServiceAccountKey}} {
		a, _ := os.ReadFile(p[0])
		b, _ := os.ReadFile(p[1])
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from the first server's", filepath.Base(p[1]))
		}
	}
	leaf := loadCert(t, joined.APIServer.Cert)
	if err := leaf.CheckSignatureFrom(loadCert(t, files.ServerCA.Cert)); err != nil {
		t.Errorf("the joined server's apiserver certificate is not signed by the cluster CA: %v", err)
	}
	// Writing the same authorities again is a no-op; another cluster's are refused.
	if err := WriteAuthorities(second.Dir, a); err != nil {
		t.Errorf("write the same authorities again: %v", err)
	}
	other, _ := run(t, testConfig(t))
	b, err := ReadAuthorities(other)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(joined.ServerCA.Cert)
	if err := WriteAuthorities(second.Dir, b); err == nil || !strings.Contains(err.Error(), "another cluster") {
		t.Errorf("write another cluster's authorities: %v, want a refusal", err)
	}
	if after, _ := os.ReadFile(joined.ServerCA.Cert); !bytes.Equal(before, after) {
		t.Error("a refused write changed the server CA")
	}

	// A server of a kelp from before the kubelet CA sends none: the joining
	// server would make one of its own, which the others do not trust.
	old := a
	old.KubeletCA = PEMPair{}
	if err := WriteAuthorities(filepath.Join(t.TempDir(), "tls"), old); err == nil || !strings.Contains(err.Error(), "kubelet-ca.crt: join through a server that runs this version of kelp") {
		t.Errorf("write authorities without the kubelet CA: %v, want a refusal naming it", err)
	}
}
