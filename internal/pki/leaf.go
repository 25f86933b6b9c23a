package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
)

// leafSpec is what one leaf certificate must look like.
type leafSpec struct {
	ca     *authority
	files  Pair
	cn     string
	orgs   []string
	usages []x509.ExtKeyUsage
	sans   []string // normalized, see normalizeSANs
}

// ensureLeaf reissues the leaf l when the one on disk cannot be kept, and
// says whether it did.
func (is issuer) ensureLeaf(l leafSpec) (bool, error) {
	certPEM, err := readOptional(l.files.Cert)
	if err != nil {
		return false, err
	}
	keyPEM, err := readOptional(l.files.Key)
	if err != nil {
		return false, err
	}
	reason := is.reissueReason(l, certPEM, keyPEM)
	if reason == "" {
		return false, nil
	}

	key, err := newKey()
	if err != nil {
		return false, err
	}
	der, err := is.sign(l, key)
	if err != nil {
		return false, err
	}
	newKeyPEM, err := encodeKey(key)
	if err != nil {
		return false, err
	}
	if err := writePair(l.files, l.ca.leafPEM(der), newKeyPEM); err != nil {
		return false, err
	}
	msg := "reissued certificate"
	if certPEM == nil {
		msg = "created certificate"
	}
	is.log.WithFields(logrus.Fields{"cert": l.files.Cert, "reason": reason}).Info(msg)
	return true, nil
}

// reissueReason says why the leaf on disk cannot be kept, or returns "" when
// it can.
func (is issuer) reissueReason(l leafSpec, certPEM, keyPEM []byte) string {
	switch {
	case certPEM == nil:
		return "missing"
	case keyPEM == nil:
		return "key missing"
	}
	cert, err := parseCert(certPEM)
	if err != nil {
		return fmt.Sprintf("certificate unparseable: %v", err)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return fmt.Sprintf("key unparseable: %v", err)
	}
	if ec, ok := key.(*ecdsa.PrivateKey); !ok || ec.Curve != elliptic.P256() {
		return "key is not ECDSA P-256"
	}
	if !samePublicKey(cert.PublicKey, key.Public()) {
		return "key does not match certificate"
	}
	if !bytes.Equal(cert.RawIssuer, l.ca.cert.RawSubject) || cert.CheckSignatureFrom(l.ca.cert) != nil {
		return "not signed by the current CA"
	}
	if !l.ca.carriedBy(certPEM) {
		return "the CA's chain changed (rotate-ca)"
	}
	if cert.Subject.CommonName != l.cn || !slices.Equal(cert.Subject.Organization, l.orgs) {
		return fmt.Sprintf("subject changed: CN=%s O=%s", l.cn, strings.Join(l.orgs, ","))
	}
	if !slices.Equal(cert.ExtKeyUsage, l.usages) {
		return "extended key usage changed"
	}
	if added, removed := diffSANs(certSANs(cert), l.sans); len(added)+len(removed) > 0 {
		var parts []string
		if len(added) > 0 {
			parts = append(parts, "added "+strings.Join(added, ", "))
		}
		if len(removed) > 0 {
			parts = append(parts, "removed "+strings.Join(removed, ", "))
		}
		return "SANs changed: " + strings.Join(parts, "; ")
	}
	// A leaf cannot outlive its CA; once it is as long-lived as the CA
	// allows, reissuing would only churn (ensureCA warns instead).
	if !cert.NotAfter.Before(l.ca.cert.NotAfter) {
		return ""
	}
	if left := cert.NotAfter.Sub(is.now); !is.now.Before(renewAt(cert)) {
		if left <= 0 {
			return "expired " + humanDuration(-left) + " ago"
		}
		return "expires in " + humanDuration(left)
	}
	// A shorter lifetime (a test's) takes effect at once.
	if cert.NotAfter.Sub(cert.NotBefore) > is.leafLifetime()+backdate {
		return "lives longer than the leaf lifetime of " + is.leafLifetime().String()
	}
	return ""
}

// humanDuration says d in days, or for a test's short-lived leaves in
// seconds.
func humanDuration(d time.Duration) string {
	if d < 24*time.Hour {
		return d.Round(time.Second).String()
	}
	return fmt.Sprintf("%d days", int(d.Hours()/24))
}

func (is issuer) sign(l leafSpec, key *ecdsa.PrivateKey) ([]byte, error) {
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	notAfter := is.now.Add(is.leafLifetime())
	if notAfter.After(l.ca.cert.NotAfter) {
		notAfter = l.ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: l.cn, Organization: l.orgs},
		NotBefore:             is.now.Add(-backdate),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           l.usages,
		BasicConstraintsValid: true,
	}
	for _, san := range l.sans {
		if ip := net.ParseIP(san); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, san)
		}
	}
	der, err := x509.CreateCertificate(nil, tmpl, l.ca.cert, key.Public(), l.ca.key)
	if err != nil {
		return nil, fmt.Errorf("pki: sign %s: %w", l.files.Cert, err)
	}
	return der, nil
}

// normalizeSANs makes SAN lists comparable regardless of order, case,
// duplicates and IP spelling ("::ffff:10.0.0.1" and "10.0.0.1" are one
// SAN once encoded).
func normalizeSANs(in []string) []string {
	out := make([]string, 0, len(in))
	for _, s := range in {
		s = strings.TrimSpace(s)
		if ip := net.ParseIP(s); ip != nil {
			s = ip.String()
		} else {
			s = strings.ToLower(strings.TrimSuffix(s, "."))
		}
		if s != "" {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func certSANs(cert *x509.Certificate) []string {
	sans := slices.Clone(cert.DNSNames)
	for _, ip := range cert.IPAddresses {
		sans = append(sans, ip.String())
	}
	return normalizeSANs(sans)
}

// diffSANs compares two normalized SAN lists.
func diffSANs(have, want []string) (added, removed []string) {
	for _, s := range want {
		if _, found := slices.BinarySearch(have, s); !found {
			added = append(added, s)
		}
	}
	for _, s := range have {
		if _, found := slices.BinarySearch(want, s); !found {
			removed = append(removed, s)
		}
	}
	return added, removed
}
