package pki

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"
)

// WitnessCerts are what an etcd witness (`kelp witness`) is issued: the
// certificates of the two etcd CAs, without their keys, and its own etcd
// serving and peer certificates. It holds no key of a CA, no certificate
// the apiserver accepts, and no node identity. The join API sends them as
// JSON with these field names.
type WitnessCerts struct {
	EtcdServerCA []byte  // verifies its own clients (the witness's tools)
	EtcdPeerCA   []byte  // verifies the other members
	Server       PEMPair // its client port's, and its tools' client to it, of the etcd server CA
	Peer         PEMPair // its peer port's, and its client to the other members, of the etcd peer CA
}

// WitnessFiles are where a witness keeps WitnessCerts.
type WitnessFiles struct {
	EtcdServerCA, EtcdPeerCA string
	Server, Peer             Pair
}

// WitnessFilesIn names the files of a witness in dir, as the server names
// its own etcd certificates (FilesIn).
func WitnessFilesIn(dir string) WitnessFiles {
	f := FilesIn(dir)
	return WitnessFiles{EtcdServerCA: f.EtcdServerCA.Cert, EtcdPeerCA: f.EtcdPeerCA.Cert, Server: f.EtcdServer, Peer: f.EtcdPeer}
}

// Leaves are the witness's own certificates, which expire.
func (f WitnessFiles) Leaves() []Pair { return []Pair{f.Server, f.Peer} }

// Write saves certs in f. It writes nothing unless every one of them is
// there.
func (f WitnessFiles) Write(certs WitnessCerts) error {
	files := map[string][]byte{
		f.EtcdServerCA: certs.EtcdServerCA, f.EtcdPeerCA: certs.EtcdPeerCA,
		f.Server.Cert: certs.Server.Cert, f.Server.Key: certs.Server.Key,
		f.Peer.Cert: certs.Peer.Cert, f.Peer.Key: certs.Peer.Key,
	}
	for path, data := range files {
		if len(data) == 0 {
			return fmt.Errorf("pki: no %s to write", filepath.Base(path))
		}
	}
	for path, data := range files {
		if err := ensurePrivateDir(filepath.Dir(path)); err != nil {
			return err
		}
		if err := writeFile(path, data); err != nil {
			return err
		}
	}
	return nil
}

// IssueWitness signs the etcd certificates of the witness name at ip with
// the etcd CAs in f, as long-lived as the server's own leaves. Both name
// ip and the loopback address: the witness's own tools reach it there.
func IssueWitness(f Files, name string, ip net.IP) (WitnessCerts, error) {
	if !validIP(ip) || ip.IsUnspecified() {
		return WitnessCerts{}, fmt.Errorf("pki: witness address %q is not an IP address", ip)
	}
	is := issuer{now: time.Now().UTC(), lifetime: f.leafLifetime(), log: logrus.WithField("component", "pki")}
	serverCA, err := loadAuthority(f.EtcdServerCA)
	if err != nil {
		return WitnessCerts{}, err
	}
	peerCA, err := loadAuthority(f.EtcdPeerCA)
	if err != nil {
		return WitnessCerts{}, err
	}
	sans := normalizeSANs([]string{ip.String(), "127.0.0.1", "localhost"})
	var out WitnessCerts
	for _, l := range []struct {
		spec leafSpec
		dst  *PEMPair
	}{
		{leafSpec{ca: serverCA, cn: "etcd-witness-server:" + name, usages: serverClientAuth, sans: sans}, &out.Server},
		{leafSpec{ca: peerCA, cn: "etcd-witness-peer:" + name, usages: serverClientAuth, sans: sans}, &out.Peer},
	} {
		pair, err := is.issue(l.spec)
		if err != nil {
			return WitnessCerts{}, err
		}
		*l.dst = pair
	}
	if out.EtcdServerCA, err = os.ReadFile(f.EtcdServerCA.Cert); err != nil {
		return WitnessCerts{}, err
	}
	if out.EtcdPeerCA, err = os.ReadFile(f.EtcdPeerCA.Cert); err != nil {
		return WitnessCerts{}, err
	}
	return out, nil
}
