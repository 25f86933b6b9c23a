package pki

import (
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
)

// authority is a loaded CA that can sign leaves.
type authority struct {
	cert *x509.Certificate
	key  crypto.Signer
	// chain are copies of cert signed by the CA it replaces, while a CA
	// rotation is in progress (see RotateCA): every leaf carries them, so
	// that a party that still trusts only the old CA verifies it.
	chain []*x509.Certificate
}

// ensureCA loads the CA in ca, creating it only when neither file exists.
// Every node and credential in the cluster trusts a CA, so a damaged one is
// an error for the operator to resolve, never a reason to make a new one.
func (is issuer) ensureCA(name string, ca Pair) (*authority, error) {
	certPEM, err := readOptional(ca.Cert)
	if err != nil {
		return nil, err
	}
	keyPEM, err := readOptional(ca.Key)
	if err != nil {
		return nil, err
	}
	moveAside := fmt.Sprintf("or move %s and %s aside to create a new CA, after which every node and kubeconfig must be set up again", ca.Cert, ca.Key)

	switch {
	case certPEM == nil && keyPEM == nil:
		key, err := newKey()
		if err != nil {
			return nil, err
		}
		keyPEM, err := encodeKey(key)
		if err != nil {
			return nil, err
		}
		// Key first: a crash between the two writes leaves a key without a
		// certificate, which the next start completes (below), rather than
		// a certificate without a key, which it must refuse.
		if err := writeFile(ca.Key, keyPEM); err != nil {
			return nil, err
		}
		a, err := is.writeCACert(name, ca.Cert, key)
		if err != nil {
			return nil, err
		}
		is.log.WithField("cert", ca.Cert).Info("created certificate authority")
		return a, nil

	case certPEM == nil:
		key, err := parseKey(keyPEM)
		if err != nil {
			return nil, fmt.Errorf("pki: CA key %s is unreadable (%v) and its certificate %s is missing; restore both from backup, %s", ca.Key, err, ca.Cert, moveAside)
		}
		a, err := is.writeCACert(name, ca.Cert, key)
		if err != nil {
			return nil, err
		}
		is.log.WithFields(logrus.Fields{"cert": ca.Cert, "reason": "certificate missing, key present"}).Info("created certificate authority from existing key")
		return a, nil

	case keyPEM == nil:
		return nil, fmt.Errorf("pki: CA certificate %s exists but its key %s is missing; restore the key from backup, %s", ca.Cert, ca.Key, moveAside)
	}

	cert, chain, err := parseCAFile(certPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate %s is unparseable (%v); restore it from backup, %s", ca.Cert, err, moveAside)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("pki: %s is not a CA certificate; restore the CA from backup, %s", ca.Cert, moveAside)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: CA key %s is unreadable (%v); restore it from backup, %s", ca.Key, err, moveAside)
	}
	if !samePublicKey(cert.PublicKey, key.Public()) {
		return nil, fmt.Errorf("pki: CA key %s does not match certificate %s; restore the matching pair from backup, %s", ca.Key, ca.Cert, moveAside)
	}
	if !is.now.Before(cert.NotAfter) {
		return nil, fmt.Errorf("pki: CA certificate %s expired on %s; install a renewed certificate for the same key, %s", ca.Cert, cert.NotAfter.Format(time.DateOnly), moveAside)
	}
	if left := cert.NotAfter.Sub(is.now); left < renewBefore {
		is.log.WithField("cert", ca.Cert).Warnf("certificate authority expires in %d days; kelp never replaces a CA, install a renewed certificate for the same key", int(left.Hours()/24))
	}
	return &authority{cert: cert, key: key, chain: chain}, nil
}

func (is issuer) writeCACert(name, certPath string, key crypto.Signer) (*authority, error) {
	cert, err := is.newCACert(name, key)
	if err != nil {
		return nil, fmt.Errorf("pki: create CA certificate %s: %w", certPath, err)
	}
	if err := writeFile(certPath, encodeCert(cert.Raw)); err != nil {
		return nil, err
	}
	return &authority{cert: cert, key: key}, nil
}

// caName is the common name of the CA name made at now.
func caName(name string, now time.Time) string { return fmt.Sprintf("%s@%d", name, now.Unix()) }

// newCACert self-signs a CA certificate for key.
func (is issuer) newCACert(name string, key crypto.Signer) (*x509.Certificate, error) {
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		// The timestamp tells apart the CAs of clusters that were torn down
		// and recreated under the same name.
		Subject:               pkix.Name{CommonName: caName(name, is.now)},
		NotBefore:             is.now.Add(-backdate),
		NotAfter:              is.now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(nil, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

// ensureServiceAccountKey creates the key that signs service-account tokens.
// Replacing it would invalidate every token in the cluster, so an existing
// key is only ever read; the public half is derived from it whenever it is
// missing or stale.
func (is issuer) ensureServiceAccountKey(keyPath, pubPath string) error {
	keyPEM, err := readOptional(keyPath)
	if err != nil {
		return err
	}
	var signer crypto.Signer
	if keyPEM == nil {
		key, err := newKey()
		if err != nil {
			return err
		}
		if keyPEM, err = encodeKey(key); err != nil {
			return err
		}
		if err := writeFile(keyPath, keyPEM); err != nil {
			return err
		}
		is.log.WithField("key", keyPath).Info("created service-account signing key")
		signer = key
	} else if signer, err = parseKey(keyPEM); err != nil {
		return fmt.Errorf("pki: service-account key %s is unreadable (%v); restore it from backup, or remove it to create a new one, which invalidates every service-account token in the cluster", keyPath, err)
	}

	pubPEM, err := readOptional(pubPath)
	if err != nil {
		return err
	}
	reason := ""
	switch pub, err := parsePublicKey(pubPEM); {
	case pubPEM == nil:
		reason = "missing"
	case err != nil:
		reason = "unparseable"
	case !samePublicKey(pub, signer.Public()):
		reason = "does not match " + keyPath
	default:
		return nil
	}
	if pubPEM, err = encodePublicKey(signer.Public()); err != nil {
		return err
	}
	if err := writeFile(pubPath, pubPEM); err != nil {
		return err
	}
	is.log.WithFields(logrus.Fields{"key": pubPath, "reason": reason}).Info("wrote service-account public key")
	return nil
}
