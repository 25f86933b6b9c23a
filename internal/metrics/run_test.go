package metrics

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kelp-dev/kelp/internal/pki"
)

// Only the aggregator, with its front-proxy client certificate, gets an
// answer; and it finds the serving certificate valid for the name it
// checks, under the server CA.
func TestAPITLS(t *testing.T) {
	files, err := pki.Ensure(pki.Config{Dir: t.TempDir(), Hostname: "server", ServiceIP: net.ParseIP("10.43.0.1"), ClusterDomain: "cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := apiTLSConfig(Config{Certs: files, ClusterDomain: "cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(testAPI(t))
	srv.TLS = cfg
	srv.StartTLS()
	defer srv.Close()

	caPEM, err := os.ReadFile(files.ServerCA.Cert)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	get := func(serverName string, client *pki.Pair) (int, error) {
		tc := &tls.Config{RootCAs: roots, ServerName: serverName}
		if client != nil {
			cert, err := tls.LoadX509KeyPair(client.Cert, client.Key)
			if err != nil {
				t.Fatal(err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
		resp, err := c.Get(srv.URL + "/apis/metrics.k8s.io/v1beta1")
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}

	for _, name := range []string{"metrics-server.kube-system.svc", "metrics-server.kube-system.svc.cluster.local"} {
		if code, err := get(name, &files.AuthProxy); err != nil || code != http.StatusOK {
			t.Errorf("the aggregator, checking %s: %d, %v", name, code, err)
		}
	}
	if _, err := get("metrics-server.kube-system.svc", nil); err == nil {
		t.Error("a client without a certificate got an answer")
	}
	// system:admin's certificate is of the client CA: good for the
	// apiserver, not for this API, which has no way to check what the
	// holder may read.
	if _, err := get("metrics-server.kube-system.svc", &files.Admin); err == nil {
		t.Error("a client with a certificate of another CA got an answer")
	}
}

func TestPublish(t *testing.T) {
	c := fake.NewClientset()
	for _, tc := range []struct {
		addr   string
		family discoveryv1.AddressType
		want   string
	}{
		{"10.99.0.2", discoveryv1.AddressTypeIPv4, "10.99.0.2"},
		{"::ffff:10.99.0.2", discoveryv1.AddressTypeIPv4, "10.99.0.2"},
		{"fd00::2", discoveryv1.AddressTypeIPv6, "fd00::2"},
	} {
		if err := publish(t.Context(), c, endpointSliceName("Server-1"), netip.MustParseAddr(tc.addr)); err != nil {
			t.Fatal(err)
		}
		s, err := c.DiscoveryV1().EndpointSlices("kube-system").Get(t.Context(), "metrics-server-server-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// What the aggregator's resolver looks at (k8s.io/apiserver's
		// proxy.ResolveEndpoint): the Service's label, a port named as the
		// Service's, a ready endpoint.
		if s.Labels[discoveryv1.LabelServiceName] != "metrics-server" || s.Labels[discoveryv1.LabelManagedBy] == "endpointslice-controller.k8s.io" {
			t.Errorf("labels %v", s.Labels)
		}
		if s.AddressType != tc.family || len(s.Endpoints) != 1 || s.Endpoints[0].Addresses[0] != tc.want || !*s.Endpoints[0].Conditions.Ready {
			t.Errorf("%s: slice %+v", tc.addr, s)
		}
		if len(s.Ports) != 1 || *s.Ports[0].Name != "https" || *s.Ports[0].Port != Port || *s.Ports[0].Protocol != corev1.ProtocolTCP {
			t.Errorf("ports %+v", s.Ports)
		}
	}
}

func TestServingCertRenewed(t *testing.T) {
	files, err := pki.Ensure(pki.Config{Dir: t.TempDir(), Hostname: "server", ServiceIP: net.ParseIP("10.43.0.1"), ClusterDomain: "cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	s := &servingCert{ca: files.ServerCA, sans: []string{"metrics-server.kube-system.svc"}}
	first, err := s.get(nil)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := s.get(nil); again != first {
		t.Error("a certificate not due yet was replaced")
	}
	if life := time.Until(first.Leaf.NotAfter); s.renewAt.Before(time.Now().Add(life/2)) || !s.renewAt.Before(first.Leaf.NotAfter) {
		t.Errorf("renewal at %s for a certificate valid until %s", s.renewAt, first.Leaf.NotAfter)
	}
	s.renewAt = time.Now().Add(-time.Second)
	if renewed, err := s.get(nil); err != nil || renewed == first {
		t.Errorf("a certificate due for renewal was kept (%v)", err)
	}
}
