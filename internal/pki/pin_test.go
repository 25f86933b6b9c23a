package pki

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// certHash is the hash a token has for one certificate of a bundle.
func certHash(t *testing.T, bundle []byte, i int) string {
	t.Helper()
	certs, err := parseCerts(bundle)
	if err != nil {
		t.Fatal(err)
	}
	return CAHash(encodeCert(certs[i].Raw))
}

// nth is the PEM of the certificates of bundle at indexes.
func nth(t *testing.T, bundle []byte, indexes ...int) []byte {
	t.Helper()
	certs, err := parseCerts(bundle)
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for _, i := range indexes {
		out = append(out, encodeCert(certs[i].Raw)...)
	}
	return out
}

// A token's hash vouches for the certificate it names and for the CAs
// that certificate's key signed, never for the rest of the bundle.
func TestPinnedCA(t *testing.T) {
	cfg := testConfig(t)
	f, _ := run(t, cfg)
	single := readFile(t, f.ServerCA.Cert)
	apiserver := readFile(t, f.APIServer.Cert)
	other, _ := run(t, testConfig(t))
	attacker := readFile(t, other.ServerCA.Cert)
	if _, err := RotateCA(cfg.Dir, "", t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	rotation := readFile(t, f.ServerCA.Cert) // the new CA, its cross-signed copy, the old CA

	two := append(append([]byte{}, single...), attacker...)
	withLeaf := append(append([]byte{}, single...), apiserver...)
	for _, tc := range []struct {
		name   string
		bundle []byte
		hash   string
		want   []byte
	}{
		{"one CA", single, CAHash(single), single},
		{"the whole rotation bundle", rotation, CAHash(rotation), rotation},
		{"the old CA of a rotation", rotation, certHash(t, rotation, 2), rotation},
		{"the cross-signed copy, second in a rotation", rotation, certHash(t, rotation, 1), nth(t, rotation, 0, 1)},
		{"the new CA of a rotation", rotation, certHash(t, rotation, 0), nth(t, rotation, 0)},
		{"the real CA beside another", two, CAHash(single), single},
		{"the other CA beside the real one", two, CAHash(attacker), attacker},
		{"a leaf the CA signed", withLeaf, CAHash(single), single},
	} {
		got, err := PinnedCA(tc.bundle, tc.hash)
		if err != nil || !bytes.Equal(got, tc.want) {
			t.Errorf("%s: %d certificates, %v; want %d", tc.name, strings.Count(string(got), "BEGIN"), err, strings.Count(string(tc.want), "BEGIN"))
		}
	}

	for _, tc := range []struct {
		name     string
		bundle   []byte
		mismatch bool
	}{
		{"nothing", nil, false},
		{"garbage", []byte("<html>hello</html>"), false},
		{"a key only", []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), false},
		{"a broken certificate", []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), false},
		{"one other CA", attacker, true},
		{"three certificates, none named", append(append([]byte{}, attacker...), rotation[:len(rotation)-len(single)]...), true},
	} {
		_, err := PinnedCA(tc.bundle, CAHash(single))
		if err == nil || errors.Is(err, ErrCAHashMismatch) != tc.mismatch {
			t.Errorf("%s: %v, want a mismatch %v", tc.name, err, tc.mismatch)
		}
	}
}
