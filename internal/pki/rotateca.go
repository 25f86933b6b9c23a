package pki

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
)

// A CA rotation replaces every CA of a cluster in two steps, each on a
// stopped server, without setting up a node again:
//
// RotateCA puts a new CA in each CA file, with the key beside it, followed
// by a copy of the new CA cross-signed by the old one and then the old CA
// as it was. The first certificate of the file signs leaves, as always;
// the whole file is the trust bundle that every reader of it (the
// apiserver's client CAs, the kubelets', the nodes' server CA, the
// kubeconfigs) loads, so that leaves of either CA verify. Each leaf the
// new CA signs carries the cross-signed copy after it, so that a party
// that still trusts only the old CA (a node that has not renewed yet, a
// copied kubeconfig, a pod's service-account CA) verifies it too.
//
// FinishCARotation leaves only the new CA in each file: leaves lose the
// cross-signed copy when they are issued next, and nothing trusts the old
// CA any more.

// ErrCARotationInProgress is a RotateCA while one is not finished.
var ErrCARotationInProgress = errors.New("a CA rotation is in progress (the CA files hold the new CA and the old one): finish it first with `kelp certificate rotate-ca --finish`, once every node picked up the new CA")

// ErrNoCARotation is a FinishCARotation with no rotation to finish.
var ErrNoCARotation = errors.New("no CA rotation is in progress: start one with `kelp certificate rotate-ca`")

// parseCerts reads every certificate in data, in order.
func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, cert)
	}
	if len(out) == 0 {
		return nil, errors.New("no CERTIFICATE PEM block")
	}
	return out, nil
}

// parseCAFile reads a CA certificate file: the CA, then while a rotation
// is in progress its cross-signed copies (returned as chain) and the CA
// it replaces (trusted only).
func parseCAFile(data []byte) (ca *x509.Certificate, chain []*x509.Certificate, err error) {
	certs, err := parseCerts(data)
	if err != nil {
		return nil, nil, err
	}
	for _, c := range certs[1:] {
		if crossSigned(certs[0], c) {
			chain = append(chain, c)
		}
	}
	return certs[0], chain, nil
}

// crossSigned says whether c is ca signed by another CA.
func crossSigned(ca, c *x509.Certificate) bool {
	return bytes.Equal(c.RawSubject, ca.RawSubject) && !bytes.Equal(c.RawIssuer, c.RawSubject) && samePublicKey(c.PublicKey, ca.PublicKey)
}

// leafPEM is the PEM of a leaf a signed, followed by a's chain.
func (a *authority) leafPEM(der []byte) []byte {
	out := encodeCert(der)
	for _, c := range a.chain {
		out = append(out, encodeCert(c.Raw)...)
	}
	return out
}

// carriedBy says whether the leaf in certPEM is followed by a's chain,
// and nothing else.
func (a *authority) carriedBy(certPEM []byte) bool {
	certs, err := parseCerts(certPEM)
	if err != nil || len(certs)-1 != len(a.chain) {
		return false
	}
	for i, c := range a.chain {
		if !bytes.Equal(certs[i+1].Raw, c.Raw) {
			return false
		}
	}
	return true
}

// caChange is the new content of one CA's files.
type caChange struct {
	files         Pair
	certPEM       []byte
	keyPEM        []byte
	backupCertPEM []byte // the old files; nil: no backup
	backupKeyPEM  []byte
}

// RotateCA starts a CA rotation in the server TLS directory dir: every CA
// gets a new certificate and key, from the files of the same names in
// from, or made anew when from is empty. The old CA files are kept as
// <name>.rotated-<time>. A CA that an interrupted RotateCA already
// rotated is left as it is. It returns the CA files it changed.
func RotateCA(dir, from string, now time.Time) ([]string, error) {
	f := FilesIn(dir)
	is := issuer{now: now.UTC(), log: logrus.WithField("component", "pki")}
	var slots loadedCAs
	var changes []caChange
	rotating := 0
	var missing []string
	for _, slot := range slots.slots(f) {
		oldPEM, err := os.ReadFile(slot.files.Cert)
		if err != nil {
			return nil, fmt.Errorf("pki: %w: rotate-ca runs on a server that has started at least once", err)
		}
		old, err := loadAuthority(slot.files)
		if err != nil {
			return nil, err
		}
		if certs, _ := parseCerts(oldPEM); len(certs) > 1 {
			rotating++
			continue
		}
		var cert *x509.Certificate
		var keyPEM []byte
		if from != "" {
			rel, err := filepath.Rel(dir, slot.files.Cert)
			if err != nil {
				return nil, err
			}
			src := Pair{Cert: filepath.Join(from, rel), Key: filepath.Join(from, strings.TrimSuffix(rel, ".crt")+".key")}
			cert, keyPEM, err = readNewCA(src, is.now)
			var m missingFiles
			if errors.As(err, &m) {
				missing = append(missing, m...)
				continue
			}
			if err != nil {
				return nil, err
			}
		} else {
			ec, err := newKey()
			if err != nil {
				return nil, err
			}
			if keyPEM, err = encodeKey(ec); err != nil {
				return nil, err
			}
			// A CA's name holds the second it was made: a CA made in the
			// same second as the current one (a script that sets up a
			// server and rotates at once) is named by the next.
			named := is
			for caName(slot.name, named.now) == old.cert.Subject.CommonName {
				named.now = named.now.Add(time.Second)
			}
			if cert, err = named.newCACert(slot.name, ec); err != nil {
				return nil, fmt.Errorf("pki: create a new CA for %s: %w", slot.files.Cert, err)
			}
		}
		if samePublicKey(cert.PublicKey, old.cert.PublicKey) {
			return nil, fmt.Errorf("pki: the new CA for %s is the current one (same key): give a new CA", slot.files.Cert)
		}
		if bytes.Equal(cert.RawSubject, old.cert.RawSubject) {
			return nil, fmt.Errorf("pki: the new CA for %s has the subject of the current one (%s): give the new CA another subject, so that nodes tell the two apart", slot.files.Cert, old.cert.Subject)
		}
		cross, err := is.crossSign(cert, old)
		if err != nil {
			return nil, fmt.Errorf("pki: cross-sign the new CA for %s: %w", slot.files.Cert, err)
		}
		oldKeyPEM, err := os.ReadFile(slot.files.Key)
		if err != nil {
			return nil, fmt.Errorf("pki: %w", err)
		}
		changes = append(changes, caChange{
			files:         slot.files,
			certPEM:       bytes.Join([][]byte{encodeCert(cert.Raw), encodeCert(cross.Raw), oldPEM}, nil),
			keyPEM:        keyPEM,
			backupCertPEM: oldPEM,
			backupKeyPEM:  oldKeyPEM,
		})
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("pki: --path %s lacks %s: it needs a certificate and key for every CA, named as in %s", from, strings.Join(missing, ", "), dir)
	}
	if rotating == len(slots.slots(f)) {
		return nil, ErrCARotationInProgress
	}
	return applyCAChanges(changes, now)
}

// FinishCARotation ends the CA rotation in dir: each CA file keeps only
// its new CA. It returns the CA files it changed.
func FinishCARotation(dir string, now time.Time) ([]string, error) {
	f := FilesIn(dir)
	var slots loadedCAs
	var changes []caChange
	for _, slot := range slots.slots(f) {
		data, err := os.ReadFile(slot.files.Cert)
		if err != nil {
			return nil, fmt.Errorf("pki: %w", err)
		}
		if _, err := loadAuthority(slot.files); err != nil {
			return nil, err
		}
		certs, err := parseCerts(data)
		if err != nil {
			return nil, fmt.Errorf("pki: %s: %w", slot.files.Cert, err)
		}
		if len(certs) == 1 {
			continue
		}
		keyPEM, err := os.ReadFile(slot.files.Key)
		if err != nil {
			return nil, fmt.Errorf("pki: %w", err)
		}
		changes = append(changes, caChange{files: slot.files, certPEM: encodeCert(certs[0].Raw), keyPEM: keyPEM})
	}
	if len(changes) == 0 {
		return nil, ErrNoCARotation
	}
	return applyCAChanges(changes, now)
}

// applyCAChanges writes the backups first, then the new CA files, and
// returns the CA certificate files it changed.
func applyCAChanges(changes []caChange, now time.Time) ([]string, error) {
	stamp := now.UTC().Format("20060102T150405Z")
	for _, c := range changes {
		if c.backupCertPEM == nil {
			continue
		}
		if err := writeFile(c.files.Cert+".rotated-"+stamp, c.backupCertPEM); err != nil {
			return nil, err
		}
		if err := writeFile(c.files.Key+".rotated-"+stamp, c.backupKeyPEM); err != nil {
			return nil, err
		}
	}
	var changed []string
	for _, c := range changes {
		if err := writePair(c.files, c.certPEM, c.keyPEM); err != nil {
			return nil, err
		}
		changed = append(changed, c.files.Cert)
	}
	return changed, nil
}

// missingFiles are files an operator was to bring.
type missingFiles []string

func (m missingFiles) Error() string { return "missing " + strings.Join(m, ", ") }

// readNewCA reads and checks a CA an operator brings, and returns its
// certificate and its key as PEM. Missing files are a missingFiles error.
func readNewCA(p Pair, now time.Time) (*x509.Certificate, []byte, error) {
	var certPEM, keyPEM []byte
	var missing []string
	for _, f := range []struct {
		path string
		data *[]byte
	}{{p.Cert, &certPEM}, {p.Key, &keyPEM}} {
		data, err := readOptional(f.path)
		if err != nil {
			return nil, nil, err
		}
		if data == nil {
			missing = append(missing, f.path)
		}
		*f.data = data
	}
	if len(missing) > 0 {
		return nil, nil, missingFiles(missing)
	}
	cert, err := parseCert(certPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: new CA %s: %w", p.Cert, err)
	}
	if !cert.BasicConstraintsValid || !cert.IsCA || cert.KeyUsage != 0 && cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, nil, fmt.Errorf("pki: %s is not a CA certificate: it needs basic constraints CA:TRUE and, if it has a key usage, keyCertSign", p.Cert)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: new CA key %s: %w", p.Key, err)
	}
	if !samePublicKey(cert.PublicKey, key.Public()) {
		return nil, nil, fmt.Errorf("pki: %s and %s do not match: give each CA certificate with its own key", p.Cert, p.Key)
	}
	if !now.Before(cert.NotAfter) {
		return nil, nil, fmt.Errorf("pki: the new CA %s expired on %s: give one that is valid", p.Cert, cert.NotAfter.Format(time.DateOnly))
	}
	if now.Before(cert.NotBefore) {
		return nil, nil, fmt.Errorf("pki: the new CA %s is not valid before %s: check this machine's clock, or give one that is valid now", p.Cert, cert.NotBefore.Format(time.RFC3339))
	}
	if cert.NotAfter.Sub(now) < renewBefore {
		return nil, nil, fmt.Errorf("pki: the new CA %s expires on %s, in less than %d days: give one that lives longer", p.Cert, cert.NotAfter.Format(time.DateOnly), int(renewBefore.Hours()/24))
	}
	return cert, keyPEM, nil
}

// crossSign signs a copy of ca with old: the same subject and key, so
// that leaves ca signs chain to old through it.
func (is issuer) crossSign(ca *x509.Certificate, old *authority) (*x509.Certificate, error) {
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		RawSubject:            ca.RawSubject,
		SubjectKeyId:          ca.SubjectKeyId,
		NotBefore:             is.now.Add(-backdate),
		NotAfter:              ca.NotAfter,
		KeyUsage:              ca.KeyUsage,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            ca.MaxPathLen,
		MaxPathLenZero:        ca.MaxPathLenZero,
	}
	der, err := x509.CreateCertificate(nil, tmpl, old.cert, ca.PublicKey, old.key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}
