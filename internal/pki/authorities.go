package pki

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Authorities are what every server of a cluster shares: the CAs with
// their keys and the service-account signing key. A server that joins gets
// them from one that runs, then issues its own leaf certificates.
type Authorities struct {
	ServerCA, ClientCA, KubeletCA, RequestHeaderCA, EtcdServerCA, EtcdPeerCA PEMPair
	ServiceAccountKey, ServiceAccountPub                                     []byte
}

// ReadAuthorities reads the shared authorities of f.
func ReadAuthorities(f Files) (Authorities, error) {
	var a Authorities
	for _, file := range a.files(f) {
		data, err := os.ReadFile(file.path)
		if err != nil {
			return Authorities{}, fmt.Errorf("pki: %w", err)
		}
		*file.data = data
	}
	return a, nil
}

// WriteAuthorities puts a in dir for Ensure to issue leaves from. It
// refuses to replace a different authority already there: that data dir
// belongs to another cluster.
func WriteAuthorities(dir string, a Authorities) error {
	f := FilesIn(dir)
	for _, d := range []string{dir, filepath.Join(dir, "etcd")} {
		if err := ensurePrivateDir(d); err != nil {
			return err
		}
	}
	files := a.files(f)
	for _, file := range files {
		if len(*file.data) == 0 {
			return fmt.Errorf("pki: the cluster's authorities lack %s: join through a server that runs this version of kelp or a newer one", filepath.Base(file.path))
		}
		have, err := readOptional(file.path)
		if err != nil {
			return err
		}
		if have != nil && !bytes.Equal(have, *file.data) {
			return fmt.Errorf("pki: %s is not the cluster's: %w", file.path, errOtherCluster)
		}
	}
	for _, file := range files {
		if err := writeFile(file.path, *file.data); err != nil {
			return err
		}
	}
	return nil
}

var errOtherCluster = errors.New("this data dir was made for another cluster; use another --data-dir, or move it away")

type authorityFile struct {
	path string
	data *[]byte
}

func (a *Authorities) files(f Files) []authorityFile {
	return []authorityFile{
		{f.ServerCA.Cert, &a.ServerCA.Cert}, {f.ServerCA.Key, &a.ServerCA.Key},
		{f.ClientCA.Cert, &a.ClientCA.Cert}, {f.ClientCA.Key, &a.ClientCA.Key},
		{f.KubeletCA.Cert, &a.KubeletCA.Cert}, {f.KubeletCA.Key, &a.KubeletCA.Key},
		{f.RequestHeaderCA.Cert, &a.RequestHeaderCA.Cert}, {f.RequestHeaderCA.Key, &a.RequestHeaderCA.Key},
		{f.EtcdServerCA.Cert, &a.EtcdServerCA.Cert}, {f.EtcdServerCA.Key, &a.EtcdServerCA.Key},
		{f.EtcdPeerCA.Cert, &a.EtcdPeerCA.Cert}, {f.EtcdPeerCA.Key, &a.EtcdPeerCA.Key},
		{f.ServiceAccountKey, &a.ServiceAccountKey}, {f.ServiceAccountPub, &a.ServiceAccountPub},
	}
}
