package pki

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// The kubelets' serving certificates have a CA of their own, KubeletCA,
// which only the kubelets' clients (the apiserver, kelp's metrics) trust.
// Signed by the server CA, which every client of the apiserver trusts, a
// node's certificate for a name of the apiserver would let the node pose
// as the apiserver. Even so, a node gets a certificate only for its own
// name and addresses, never for a name or address of the apiserver.

// MaxKubeletSANs is the most names and addresses a node's serving
// certificate holds: its name and its addresses, which are a few.
const MaxKubeletSANs = 16

// ErrKubeletSANs is a node's serving certificate asked for names or
// addresses that are not the node's own.
var ErrKubeletSANs = errors.New("the node's serving certificate may name only the node and its own addresses")

// kubeletSANs are what the serving certificate of the node name with the
// addresses ips holds. Not localhost: nothing reaches a kubelet's TLS port
// over loopback (the apiserver and kelp's metrics use the node's address;
// the kubelet's /healthz is plain HTTP on 127.0.0.1).
func kubeletSANs(name string, ips []net.IP) []string {
	sans := []string{strings.ToLower(name)}
	for _, ip := range ips {
		sans = append(sans, ip.String())
	}
	return normalizeSANs(sans)
}

// CheckKubeletSANs refuses a serving certificate for the node name with
// the addresses ips that would name more than the node: a name or address
// of the apiserver (those its serving certificate in f holds, the
// kubernetes Service's names, and servers, the addresses of the cluster's
// other apiservers), loopback, or more than MaxKubeletSANs.
func CheckKubeletSANs(f Files, name string, ips, servers []net.IP) error {
	sans := kubeletSANs(name, ips)
	if len(sans) > MaxKubeletSANs {
		return fmt.Errorf("%w: node %q asks for %d names and addresses, at most %d are allowed: give it fewer --node-ip", ErrKubeletSANs, name, len(sans), MaxKubeletSANs)
	}
	data, err := readOptional(f.APIServer.Cert)
	if err != nil {
		return err
	}
	if data == nil {
		return fmt.Errorf("pki: %s is missing: the server issues it at its start", f.APIServer.Cert)
	}
	apiserver, err := parseCert(data)
	if err != nil {
		return fmt.Errorf("pki: %s: %w", f.APIServer.Cert, err)
	}
	apiserverSANs := map[string]bool{}
	for _, s := range certSANs(apiserver) {
		apiserverSANs[s] = true
	}
	for _, ip := range servers {
		apiserverSANs[ip.String()] = true
	}
	var refused []string
	for _, s := range sans {
		if why := notTheNodes(s, apiserverSANs); why != "" {
			refused = append(refused, fmt.Sprintf("%s (%s)", s, why))
		}
	}
	if len(refused) > 0 {
		return fmt.Errorf("%w: node %q asks for %s: check its --node-name and --node-ip", ErrKubeletSANs, name, strings.Join(refused, ", "))
	}
	return nil
}

// notTheNodes says why the normalized SAN s cannot be a joining node's,
// or "" when it can.
func notTheNodes(s string, apiserver map[string]bool) string {
	if ip := net.ParseIP(s); ip != nil {
		switch {
		case ip.IsLoopback():
			return "a loopback address"
		case ip.IsUnspecified() || ip.IsMulticast():
			return "not a node's address"
		case apiserver[s]:
			return "an address of the apiserver"
		}
		return ""
	}
	switch {
	case s == "localhost" || strings.HasSuffix(s, ".localhost"):
		return "a loopback name"
	case s == "kubernetes" || s == "kubernetes.default" || s == "kubernetes.default.svc" || strings.HasPrefix(s, "kubernetes.default.svc."):
		return "a name of the apiserver"
	case apiserver[s]:
		return "a name of the apiserver"
	}
	return ""
}

// kubeletCAMissing says whether Ensure is about to make the kubelet CA
// of a cluster made before there was one: the server CA exists.
func kubeletCAMissing(f Files) (bool, error) {
	for _, p := range []string{f.KubeletCA.Cert, f.KubeletCA.Key} {
		if data, err := readOptional(p); err != nil || data != nil {
			return false, err
		}
	}
	data, err := readOptional(f.ServerCA.Cert)
	return data != nil, err
}

// copyServerCA makes the kubelet CA a copy of the server CA, when the
// kubelet CA's certificate is missing and its key is missing too or is
// the server CA's: an earlier copy cut short. The key goes first, as
// ensureCA writes a CA, so that a crash leaves what the next start copies
// again. It says whether it copied.
func copyServerCA(f Files) (bool, error) {
	cert, err := readOptional(f.KubeletCA.Cert)
	if err != nil || cert != nil {
		return false, err
	}
	key, err := readOptional(f.KubeletCA.Key)
	if err != nil {
		return false, err
	}
	serverKey, err := readOptional(f.ServerCA.Key)
	if err != nil || serverKey == nil || (key != nil && !bytes.Equal(key, serverKey)) {
		return false, err
	}
	serverCert, err := readOptional(f.ServerCA.Cert)
	if err != nil || serverCert == nil {
		return false, err
	}
	if err := writeFile(f.KubeletCA.Key, serverKey); err != nil {
		return false, err
	}
	return true, writeFile(f.KubeletCA.Cert, serverCert)
}

// writeKubeletTrust writes what the kubelets' clients verify them with:
// the kubelet CA's file (during a CA rotation, the new CA and the old),
// followed, while a kubelet serving certificate of the server CA may be
// valid still, by the server CA's.
func (is issuer) writeKubeletTrust(f Files, cas loadedCAs) error {
	trust, err := readOptional(f.KubeletCA.Cert)
	if err != nil {
		return err
	}
	if end := serverCATrustedForKubeletsUntil(cas.kubelet.cert, cas.server.cert); is.now.Before(end) {
		server, err := readOptional(f.ServerCA.Cert)
		if err != nil {
			return err
		}
		trust = append(trust, server...)
	}
	return writeIfChanged(f.KubeletTrust, trust)
}

// serverCATrustedForKubeletsUntil is until when the kubelets' clients
// trust the server CA too, which signed the kubelets' serving
// certificates before there was a kubelet CA. A cluster made with a
// kubelet CA made both at once, and never trusts the server CA for
// kubelets. One that got its kubelet CA later, at an upgrade, has nodes
// that have not restarted since, with certificates of the server CA that
// are renewed only when due: they live a leaf lifetime at most. The dates
// are those of the CA certificates, the same on every server of the
// cluster; a CA rotation (kelp certificate rotate-ca), which renews every
// node's certificates, makes both at once again.
func serverCATrustedForKubeletsUntil(kubeletCA, serverCA *x509.Certificate) time.Time {
	if !kubeletCA.NotBefore.After(serverCA.NotBefore) {
		return time.Time{}
	}
	return kubeletCA.NotBefore.Add(backdate + leafValidity)
}
