package pki

import (
	"bytes"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// verify says whether the first certificate in leafPEM verifies against
// the CAs in roots, with the certificates after it as intermediates.
func verify(t *testing.T, leafPEM []byte, roots ...*x509.Certificate) error {
	t.Helper()
	certs, err := parseCerts(leafPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err = certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}

// clientBundleFirst is the CA that signs in f's client CA file.
func clientBundleFirst(t *testing.T, f Files) *x509.Certificate {
	t.Helper()
	certs, err := parseCerts(readFile(t, f.ClientCA.Cert))
	if err != nil {
		t.Fatal(err)
	}
	return certs[0]
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// A rotation puts a new CA first in each CA file, with its cross-signed
// copy and the old CA: leaves issued from then on carry the copy, so that
// parties that trust only the old CA, or only the new one, verify them,
// and leaves of the old CA still verify against the file. Finishing leaves
// the new CA alone, and leaves issued then verify against it only.
func TestRotateCA(t *testing.T) {
	cfg := testConfig(t)
	f, _ := run(t, cfg)
	oldServerPEM := readFile(t, f.ServerCA.Cert)
	oldServer := loadCert(t, f.ServerCA.Cert)
	oldClient := loadCert(t, f.ClientCA.Cert)
	oldKubelet := loadCert(t, f.KubeletCA.Cert)
	oldHash := CAHash(oldServerPEM)
	joinedBefore, err := IssueNode(f, "agent-1", nil)
	if err != nil {
		t.Fatal(err)
	}

	t1 := t0.Add(24 * time.Hour)
	changed, err := RotateCA(cfg.Dir, "", t1)
	if err != nil {
		t.Fatal(err)
	}
	if len(changed) != 6 {
		t.Errorf("rotated %v, want the six CAs", changed)
	}
	bundle, err := parseCerts(readFile(t, f.ServerCA.Cert))
	if err != nil {
		t.Fatal(err)
	}
	newServer := bundle[0]
	if len(bundle) != 3 || !crossSigned(newServer, bundle[1]) || !bytes.Equal(bundle[2].Raw, oldServer.Raw) || !bytes.HasSuffix(readFile(t, f.ServerCA.Cert), oldServerPEM) {
		t.Fatalf("server-ca.crt holds %d certificates, want the new CA, its cross-signed copy and the old CA as it was", len(bundle))
	}
	if err := bundle[1].CheckSignatureFrom(oldServer); err != nil {
		t.Errorf("the cross-signed copy is not signed by the old CA: %v", err)
	}
	if !samePublicKey(newServer.PublicKey, loadKey(t, f.ServerCA.Key).Public()) {
		t.Error("server-ca.key is not the new CA's key")
	}
	if _, err := os.Stat(f.ServerCA.Key + ".rotated-" + t1.Format("20060102T150405Z")); err != nil {
		t.Errorf("the old key was not kept: %v", err)
	}
	served := readFile(t, f.ServerCA.Cert)
	for name, hash := range map[string]string{"the old CA": oldHash, "the bundle": CAHash(served)} {
		if pinned, err := PinnedCA(served, hash); err != nil || !bytes.Equal(pinned, served) {
			t.Errorf("PinnedCA with the hash of %s: %v; want the whole bundle", name, err)
		}
	}
	if _, err := PinnedCA(served, CAHash([]byte("other"))); !errors.Is(err, ErrCAHashMismatch) {
		t.Errorf("PinnedCA with another hash: %v", err)
	}

	// The server's next start reissues every leaf from the new CAs, and
	// gives the controller-manager's signers the new CAs alone.
	run(t, at(cfg, t1))
	for signer, ca := range map[string]*x509.Certificate{f.ServerCASigner: newServer, f.ClientCASigner: clientBundleFirst(t, f)} {
		if certs, err := parseCerts(readFile(t, signer)); err != nil || len(certs) != 1 || !certs[0].Equal(ca) {
			t.Errorf("%s: %d certificates (%v), want the new CA alone", signer, len(certs), err)
		}
	}
	apiserver := readFile(t, f.APIServer.Cert)
	if leaf, _ := parseCerts(apiserver); len(leaf) != 2 || !bytes.Equal(leaf[0].RawIssuer, newServer.RawSubject) {
		t.Fatalf("the apiserver's certificate: %d certificates, want the leaf of the new CA and the cross-signed copy", len(leaf))
	}
	for name, roots := range map[string][]*x509.Certificate{"the old CA": {oldServer}, "the new CA": {newServer}, "the bundle": bundle} {
		if err := verify(t, apiserver, roots...); err != nil {
			t.Errorf("the apiserver's certificate against %s: %v", name, err)
		}
	}
	clientBundle, _ := parseCerts(readFile(t, f.ClientCA.Cert))
	if err := verify(t, joinedBefore.KubeletClient.Cert, clientBundle...); err != nil {
		t.Errorf("a node's client certificate from before the rotation, against the client CA file: %v", err)
	}
	joined, err := IssueNode(f, "agent-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := verify(t, joined.KubeletServing.Cert, oldKubelet); err != nil {
		t.Errorf("a node's serving certificate against the old kubelet CA only: %v", err)
	}
	if err := verify(t, joined.KubeletClient.Cert, oldClient); err != nil {
		t.Errorf("a node's client certificate against the old CA only: %v", err)
	}

	if _, err := RotateCA(cfg.Dir, "", t1); !errors.Is(err, ErrCARotationInProgress) {
		t.Errorf("a second rotation before finishing: %v", err)
	}
	statuses, err := Check(cfg.Dir, t1)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range statuses {
		if s.Path == f.ServerCA.Cert && (s.Subject != newServer.Subject.CommonName || len(s.AlsoTrusted) != 1 || s.AlsoTrusted[0] != oldServer.Subject.CommonName) {
			t.Errorf("check: %+v, want the new CA that also trusts %s", s, oldServer.Subject.CommonName)
		}
	}

	t2 := t1.Add(time.Hour)
	if _, err := FinishCARotation(cfg.Dir, t2); err != nil {
		t.Fatal(err)
	}
	if certs, _ := parseCerts(readFile(t, f.ServerCA.Cert)); len(certs) != 1 || !bytes.Equal(certs[0].Raw, newServer.Raw) {
		t.Fatalf("after finishing, server-ca.crt holds %d certificates, want the new CA only", len(certs))
	}
	run(t, at(cfg, t2))
	apiserver = readFile(t, f.APIServer.Cert)
	if leaf, _ := parseCerts(apiserver); len(leaf) != 1 {
		t.Errorf("after finishing, the apiserver's certificate file holds %d certificates, want the leaf alone", len(leaf))
	}
	if err := verify(t, apiserver, newServer); err != nil {
		t.Errorf("after finishing, the apiserver's certificate against the new CA: %v", err)
	}
	if err := verify(t, apiserver, oldServer); err == nil {
		t.Error("after finishing, the apiserver's certificate still verifies against the old CA")
	}
	if _, err := FinishCARotation(cfg.Dir, t2); !errors.Is(err, ErrNoCARotation) {
		t.Errorf("finishing twice: %v", err)
	}
	if _, err := PinnedCA(readFile(t, f.ServerCA.Cert), oldHash); !errors.Is(err, ErrCAHashMismatch) {
		t.Errorf("after finishing, the old token's CA hash: %v, want no match", err)
	}
}

// newCADir makes the CA files of another cluster, for --path.
func newCADir(t *testing.T) string {
	t.Helper()
	cfg := testConfig(t)
	cfg.Now = func() time.Time { return t0.Add(time.Hour) }
	run(t, cfg)
	src := FilesIn(cfg.Dir)
	dir := t.TempDir()
	dst := FilesIn(dir)
	if err := os.MkdirAll(filepath.Join(dir, "etcd"), 0o700); err != nil {
		t.Fatal(err)
	}
	var s, d loadedCAs
	for i, slot := range s.slots(src) {
		to := d.slots(dst)[i].files
		copyFile(t, slot.files.Cert, to.Cert)
		copyFile(t, slot.files.Key, to.Key)
	}
	return dir
}

// CAs brought with --path are checked, all of them before anything is
// written.
func TestRotateCAFromPath(t *testing.T) {
	cfg := testConfig(t)
	f, _ := run(t, cfg)
	before := snapshot(t, f)
	t1 := t0.Add(24 * time.Hour)

	expired := newCADir(t)
	is := issuer{now: t0.Add(-10 * 365 * 24 * time.Hour)}
	key, err := newKey()
	if err != nil {
		t.Fatal(err)
	}
	old, err := is.newCACert("kelp-client-ca", key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, _ := encodeKey(key)
	write(t, FilesIn(expired).ClientCA.Cert, encodeCert(old.Raw))
	write(t, FilesIn(expired).ClientCA.Key, keyPEM)

	mismatch := newCADir(t)
	copyFile(t, FilesIn(mismatch).ClientCA.Key, FilesIn(mismatch).ServerCA.Key)

	notCA := newCADir(t)
	copyFile(t, f.APIServer.Cert, FilesIn(notCA).ServerCA.Cert)
	copyFile(t, f.APIServer.Key, FilesIn(notCA).ServerCA.Key)

	missing := newCADir(t)
	remove(t, FilesIn(missing).EtcdPeerCA.Key)
	remove(t, FilesIn(missing).RequestHeaderCA.Cert)

	current := newCADir(t)
	copyFile(t, f.ServerCA.Cert, FilesIn(current).ServerCA.Cert)
	copyFile(t, f.ServerCA.Key, FilesIn(current).ServerCA.Key)

	for _, tc := range []struct {
		name, dir string
		want      []string
	}{
		{"a key of another certificate", mismatch, []string{"server-ca.crt", "server-ca.key", "do not match"}},
		{"a certificate that is not a CA", notCA, []string{"server-ca.crt", "is not a CA certificate"}},
		{"an expired CA", expired, []string{"client-ca.crt", "expired on"}},
		{"missing files", missing, []string{"lacks", "etcd/peer-ca.key", "request-header-ca.crt"}},
		{"the current CA", current, []string{"server-ca.crt", "is the current one"}},
		{"no directory", filepath.Join(t.TempDir(), "nothing"), []string{"lacks", "server-ca.crt"}},
	} {
		_, err := RotateCA(cfg.Dir, tc.dir, t1)
		for _, want := range tc.want {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %v, want an error that says %q", tc.name, err, want)
			}
		}
		if diff := changed(before, snapshot(t, f)); len(diff) > 0 {
			t.Fatalf("%s: wrote %v", tc.name, diff)
		}
	}

	good := newCADir(t)
	if _, err := RotateCA(cfg.Dir, good, t1); err != nil {
		t.Fatal(err)
	}
	for _, p := range []Pair{f.ServerCA, f.EtcdPeerCA} {
		rel, _ := filepath.Rel(cfg.Dir, p.Cert)
		want := loadCert(t, filepath.Join(good, rel))
		if got := loadCert(t, p.Cert); !bytes.Equal(got.Raw, want.Raw) {
			t.Errorf("%s: not the CA from --path", p.Cert)
		}
	}
	run(t, at(cfg, t1))
}

// An interrupted rotation is completed by running it again: the CAs it
// rotated stay as they are.
func TestRotateCACompletesInterrupted(t *testing.T) {
	cfg := testConfig(t)
	f, _ := run(t, cfg)
	t1 := t0.Add(24 * time.Hour)
	oldClient := readFile(t, f.ClientCA.Cert)
	if _, err := RotateCA(cfg.Dir, "", t1); err != nil {
		t.Fatal(err)
	}
	rotatedServer := readFile(t, f.ServerCA.Cert)
	write(t, f.ClientCA.Cert, oldClient)
	copyFile(t, f.ClientCA.Key+".rotated-"+t1.Format("20060102T150405Z"), f.ClientCA.Key)
	changed, err := RotateCA(cfg.Dir, "", t1.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(changed) != 1 || changed[0] != f.ClientCA.Cert {
		t.Errorf("rotated %v, want the client CA only", changed)
	}
	if !bytes.Equal(readFile(t, f.ServerCA.Cert), rotatedServer) {
		t.Error("the server CA, rotated already, changed")
	}
}
