package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

// TestServerNewAddress restarts a server, which runs a node, at another
// address than it had, as after a new DHCP lease: it serves the apiserver
// and its kubelet under certificates that name the new address, and its
// Node's InternalIP follows.
func TestServerNewAddress(t *testing.T) {
	t.Parallel()
	lab := testcluster.NewLab(t)
	srv := lab.NewNode("server", "10.99.0.2")
	srv.Agent = true
	srv.Start()
	srv.WaitReady(startTimeout)
	srv.WaitLog("kelp node is running", startTimeout)
	c := srv.Client()
	waitInternalIP(t, c, "server", "10.99.0.2")

	srv.Stop()
	lab.Readdress(srv, "10.99.0.12")
	srv.Start()
	srv.WaitReady(startTimeout)
	srv.WaitLog("kelp node is running", startTimeout)
	certs := pki.FilesIn(layout.Server(srv.DataDir).TLS)
	if err := verifiedAt(srv, "10.99.0.12:6443", certs.ServerCA.Cert); err != nil {
		t.Errorf("the apiserver at the server's new address: %v", err)
	}
	testcluster.Eventually(t, "the kubelet verified at the server's new address", func() (bool, error) {
		return verifiedAt(srv, "10.99.0.12:10250", certs.KubeletTrust) == nil, nil
	})
	waitInternalIP(t, c, "server", "10.99.0.12")
	waitNodesReady(t, c, 1)
}

// TestAgentNewAddress restarts an agent at another address than it had:
// it joins again with certificates for the new address, its Node's
// InternalIP follows, and its pod, which ran on, is reached across the
// overlay from a pod on the server's node again.
func TestAgentNewAddress(t *testing.T) {
	t.Parallel()
	lab := testcluster.NewLab(t)
	image := testcluster.BuildTestImage(t, testcluster.TestImage)
	srv, agent := lab.NewNode("server", "10.99.0.2"), lab.NewNode("agent-1", "10.99.0.3")
	for _, n := range []*testcluster.Node{srv, agent} {
		n.AddImage(image)
	}
	srv.Agent = true
	srv.Start()
	srv.WaitReady(startTimeout)
	srv.WaitLog("kelp node is running", startTimeout)
	agent.StartAgent(srv.URL(), srv.TokenFile())
	agent.WaitLog("kelp node is running", startTimeout)
	c := srv.Client()
	waitNodesReady(t, c, 2)
	waitServiceAccount(t, c, "default")
	apply(t, srv, testcluster.App{Kind: "DaemonSet", Name: "web", Ready: true}.YAML())
	rolloutStatus(t, srv, "daemonset/web", 170*time.Second)
	reached := func(when string) {
		t.Helper()
		pods := podsByNode(t, c, "app=web")
		from, to := pods["server"], pods["agent-1"]
		testcluster.Eventually(t, "the pod on agent-1 from the server's "+when, func() (bool, error) {
			out, err := srv.Kubectl("exec", from.Name, "--", "/testapp", "get", "http://"+to.Status.PodIP+":8080/", "3s")
			return err == nil && strings.HasPrefix(out, to.Name+" "), nil
		})
	}
	reached("before the move")

	agent.Stop()
	lab.Readdress(agent, "10.99.0.13")
	agent.StartAgent(srv.URL(), srv.TokenFile())
	agent.WaitLog("kelp node is running", startTimeout)
	waitInternalIP(t, c, "agent-1", "10.99.0.13")
	waitNodesReady(t, c, 2)
	checkKubeletServing(t, srv, agent)
	reached("after the move")
}

// TestServerMemberNewAddress restarts one of three servers on embedded
// etcd at another address than it had: its etcd member's peer URL is
// changed to the new address, and the cluster writes on with that
// server and one other.
func TestServerMemberNewAddress(t *testing.T) {
	t.Parallel()
	lab := testcluster.NewLab(t)
	s1, s2, s3 := lab.NewNode("server-1", "10.99.0.2"), lab.NewNode("server-2", "10.99.0.3"), lab.NewNode("server-3", "10.99.0.4")
	s1.Start("--cluster-init")
	s1.WaitReady(startTimeout)
	joinArgs := s1.JoinArgs()
	var wg sync.WaitGroup
	for _, s := range []*testcluster.Node{s2, s3} {
		s.Start(joinArgs...)
		wg.Add(1)
		go func() { defer wg.Done(); s.WaitReady(2 * startTimeout) }()
	}
	wg.Wait()
	members := func() string {
		out, err := s1.RunKelp(time.Minute, "etcdctl", "--data-dir", s1.DataDir, "member", "list")
		if err != nil {
			return ""
		}
		return out
	}
	testcluster.Eventually(t, "three started voting members", func() (bool, error) {
		out := members()
		return strings.Count(out, ", started, ") == 3 && !strings.Contains(out, "true"), nil
	})

	s3.Stop()
	lab.Readdress(s3, "10.99.0.14")
	s3.Start(joinArgs...)
	s3.WaitReady(startTimeout)
	testcluster.Eventually(t, "server-3's member at its new peer URL", func() (bool, error) {
		out := members()
		return strings.Contains(out, "https://10.99.0.14:2380") && !strings.Contains(out, "https://10.99.0.4:2380"), nil
	})
	certs := pki.FilesIn(layout.Server(s1.DataDir).TLS)
	if err := verifiedAt(s1, "10.99.0.14:2380", certs.EtcdPeerCA.Cert, certs.EtcdPeer); err != nil {
		t.Errorf("server-3's etcd peer port at its new address: %v", err)
	}
	// With server-2 away, a write needs server-1 and server-3 to reach
	// each other.
	s2.Stop()
	must(t, "a write through server-3", func() error { return writeConfigMap(s3.Client(), "moved") })
	testcluster.Eventually(t, "server-1 reads server-3's write", func() (bool, error) {
		_, err := s1.Client().CoreV1().ConfigMaps("default").Get(context.Background(), "moved", metav1.GetOptions{})
		return err == nil, nil
	})
}

// waitInternalIP waits until node's InternalIP is ip, and ip alone.
func waitInternalIP(t *testing.T, c kubernetes.Interface, node, ip string) {
	t.Helper()
	testcluster.EventuallyWithin(t, startTimeout, fmt.Sprintf("%s's InternalIP %s", node, ip), func() (bool, error) {
		n, err := c.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		var internal []string
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				internal = append(internal, a.Address)
			}
		}
		if len(internal) != 1 || internal[0] != ip {
			return false, fmt.Errorf("InternalIP %v", internal)
		}
		return true, nil
	})
}

// verifiedAt dials addr from inside node, with client's certificate if
// given, and verifies the certificate served there with the CAs in caFile
// for addr's host, an IP address.
func verifiedAt(node *testcluster.Node, addr, caFile string, client ...pki.Pair) error {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return fmt.Errorf("no CA in %s", caFile)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	cfg := &tls.Config{RootCAs: roots, ServerName: host}
	for _, p := range client {
		cert, err := tls.LoadX509KeyPair(p.Cert, p.Key)
		if err != nil {
			return err
		}
		cfg.Certificates = append(cfg.Certificates, cert)
	}
	return node.InNetns(func() error {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
		if err != nil {
			return err
		}
		return conn.Close()
	})
}
