package pki

import (
	"time"

	"github.com/sirupsen/logrus"
)

// IssueServing signs a serving certificate for sans (DNS names or IPs)
// with the CA in ca, in memory: for a server that makes a new one at every
// start and keeps nothing on disk.
func IssueServing(ca Pair, cn string, sans []string) (PEMPair, error) {
	authority, err := loadAuthority(ca)
	if err != nil {
		return PEMPair{}, err
	}
	is := issuer{now: time.Now().UTC(), log: logrus.WithField("component", "pki")}
	return is.issue(leafSpec{ca: authority, cn: cn, usages: serverAuth, sans: normalizeSANs(sans)})
}

// issue signs a new key for l and returns both, written nowhere.
func (is issuer) issue(l leafSpec) (PEMPair, error) {
	l.files.Cert = l.cn // names the certificate in errors
	key, err := newKey()
	if err != nil {
		return PEMPair{}, err
	}
	der, err := is.sign(l, key)
	if err != nil {
		return PEMPair{}, err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return PEMPair{}, err
	}
	return PEMPair{Cert: l.ca.leafPEM(der), Key: keyPEM}, nil
}
