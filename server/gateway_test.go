package server_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// gatewayApp is what TestGateway exposes: one echo replica behind a
// Service, two Gateways of the class kelp (HTTP and HTTPS on 80 and 443,
// HTTP on 8080), a route by hostname on both, one on the second Gateway
// and one to a Service that does not exist.
var gatewayApp = testcluster.App{Name: "app", Ready: true}.YAML() + `---
apiVersion: v1
kind: Service
metadata: {name: app}
spec:
  selector: {app: app}
  ports: [{name: web, port: 80, targetPort: http}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: web}
spec:
  gatewayClassName: kelp
  listeners:
  - {name: http, protocol: HTTP, port: 80}
  - name: https
    protocol: HTTPS
    port: 443
    hostname: app.example.test
    tls: {certificateRefs: [{name: app-tls}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: alt}
spec:
  gatewayClassName: kelp
  listeners:
  - {name: http, protocol: HTTP, port: 8080}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: busy}
spec:
  gatewayClassName: kelp
  listeners:
  - {name: http, protocol: HTTP, port: 9090}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: app}
spec:
  parentRefs: [{name: web}]
  hostnames: [app.example.test]
  rules:
  - backendRefs: [{name: app, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: missing}
spec:
  parentRefs: [{name: web}]
  hostnames: [app.example.test]
  rules:
  - matches: [{path: {type: PathPrefix, value: /missing}}]
    backendRefs: [{name: nothing-here, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: alt}
spec:
  parentRefs: [{name: alt}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /}}]
    filters:
    - type: ResponseHeaderModifier
      responseHeaderModifier: {set: [{name: X-Gateway, value: alt}]}
    backendRefs: [{name: app, port: 80}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: app}
spec:
  ingressClassName: kelp
  rules:
  - host: ingress.example.test
    http:
      paths: [{path: /, pathType: Prefix, backend: {service: {name: app, port: {name: web}}}}]
`

// TestGateway runs a server with its node and reaches an app through the
// Gateway API from outside the node: by hostname over HTTP and HTTPS, on
// a second Gateway's port, a route to a missing Service answering 500
// with BackendNotFound in its status while the others serve, a port
// already in use reported on its listener, an Ingress of the class kelp,
// and a TLS Secret rotated: new connections get the new certificate, an
// open one keeps working.
func TestGateway(t *testing.T) {
	t.Parallel()
	n := testcluster.NewNode(t)
	n.Agent = true
	n.AddImage(testcluster.BuildTestImage(t, testcluster.TestImage))
	n.Start()
	n.WaitReady(startTimeout)
	n.WaitLog("kelp node is running", startTimeout)
	c := n.Client()
	gw, err := gatewayclient.NewForConfig(n.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	waitNodeReady(t, c)
	waitServiceAccount(t, c, "default")
	// Something else on the node holds 9090, which the Gateway busy asks for.
	busy, err := n.Listen("tcp", ":9090")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()

	ca1, cert1 := newServingCert(t, "app.example.test")
	ca2, cert2 := newServingCert(t, "app.example.test")
	apply(t, n, tlsSecret("app-tls", cert1))
	testcluster.Eventually(t, "the Gateway API CRDs and the GatewayClass kelp", func() (bool, error) {
		gc, err := gw.GatewayV1().GatewayClasses().Get(context.Background(), "kelp", metav1.GetOptions{})
		return err == nil && apimeta.IsStatusConditionTrue(gc.Status.Conditions, "Accepted"), nil
	})
	apply(t, n, gatewayApp)
	kubectl(t, n, "wait", "--for=condition=Available", "deployment/app", "--timeout=120s")

	var addr string
	testcluster.Eventually(t, "Gateway web programmed with an address", func() (bool, error) {
		g, err := gw.GatewayV1().Gateways("default").Get(context.Background(), "web", metav1.GetOptions{})
		if err != nil || !apimeta.IsStatusConditionTrue(g.Status.Conditions, "Programmed") || len(g.Status.Addresses) == 0 {
			return false, nil
		}
		addr = g.Status.Addresses[0].Value
		return true, nil
	})
	testcluster.Eventually(t, "HTTPRoute missing: ResolvedRefs False, BackendNotFound", func() (bool, error) {
		r, err := gw.GatewayV1().HTTPRoutes("default").Get(context.Background(), "missing", metav1.GetOptions{})
		if err != nil || len(r.Status.Parents) != 1 {
			return false, nil
		}
		got := apimeta.FindStatusCondition(r.Status.Parents[0].Conditions, "ResolvedRefs")
		return got != nil && got.Status == metav1.ConditionFalse && got.Reason == string(gatewayv1.RouteReasonBackendNotFound) && got.ObservedGeneration == r.Generation, nil
	})
	testcluster.Eventually(t, "Gateway busy: listener Accepted False, PortUnavailable", func() (bool, error) {
		g, err := gw.GatewayV1().Gateways("default").Get(context.Background(), "busy", metav1.GetOptions{})
		if err != nil || len(g.Status.Listeners) != 1 {
			return false, nil
		}
		got := apimeta.FindStatusCondition(g.Status.Listeners[0].Conditions, "Accepted")
		return got != nil && got.Status == metav1.ConditionFalse && got.Reason == string(gatewayv1.ListenerReasonPortUnavailable), nil
	})

	httpClient := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: n.DialContext}}
	get := func(url, host string) (int, http.Header, string, error) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Host = host
		resp, err := httpClient.Do(req)
		if err != nil {
			return 0, nil, "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(body), nil
	}
	t.Run("HTTP by hostname", func(t *testing.T) {
		testcluster.Eventually(t, "the app over HTTP", func() (bool, error) {
			code, _, body, err := get("http://"+net.JoinHostPort(addr, "80")+"/", "app.example.test")
			return err == nil && code == http.StatusOK && strings.HasPrefix(body, "app-"), nil
		})
		if code, _, _, err := get("http://"+net.JoinHostPort(addr, "80")+"/", "other.example.test"); err != nil || code != http.StatusNotFound {
			t.Errorf("another host: %d %v, want 404", code, err)
		}
	})
	t.Run("Ingress of the class kelp", func(t *testing.T) {
		testcluster.Eventually(t, "the app through the Ingress", func() (bool, error) {
			code, _, body, err := get("http://"+net.JoinHostPort(addr, "80")+"/", "ingress.example.test")
			return err == nil && code == http.StatusOK && strings.HasPrefix(body, "app-"), nil
		})
		testcluster.Eventually(t, "the Ingress's address", func() (bool, error) {
			ing, err := c.NetworkingV1().Ingresses("default").Get(context.Background(), "app", metav1.GetOptions{})
			return err == nil && len(ing.Status.LoadBalancer.Ingress) == 1 && ing.Status.LoadBalancer.Ingress[0].IP == addr, nil
		})
	})
	t.Run("missing Service answers 500", func(t *testing.T) {
		code, _, _, err := get("http://"+net.JoinHostPort(addr, "80")+"/missing/x", "app.example.test")
		if err != nil || code != http.StatusInternalServerError {
			t.Errorf("/missing/x: %d %v, want 500", code, err)
		}
	})
	t.Run("a new route serves", func(t *testing.T) {
		began := time.Now()
		apply(t, n, `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: late}
spec:
  parentRefs: [{name: web, sectionName: http}]
  hostnames: [late.example.test]
  rules:
  - backendRefs: [{name: app, port: 80}]
`)
		testcluster.Eventually(t, "the new route", func() (bool, error) {
			code, _, _, err := get("http://"+net.JoinHostPort(addr, "80")+"/", "late.example.test")
			return err == nil && code == http.StatusOK, nil
		})
		t.Logf("from kubectl apply of an HTTPRoute to its first answer: %s", time.Since(began).Round(10*time.Millisecond))
	})
	t.Run("second Gateway on 8080", func(t *testing.T) {
		testcluster.Eventually(t, "the app on 8080", func() (bool, error) {
			code, h, body, err := get("http://"+net.JoinHostPort(addr, "8080")+"/", "anything")
			return err == nil && code == http.StatusOK && h.Get("X-Gateway") == "alt" && strings.HasPrefix(body, "app-"), nil
		})
	})

	// One TLS connection, kept open across the rotation.
	dialTLS := func(roots *x509.CertPool) (*tls.Conn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		raw, err := n.DialContext(ctx, "tcp", net.JoinHostPort(addr, "443"))
		if err != nil {
			return nil, err
		}
		conn := tls.Client(raw, &tls.Config{ServerName: "app.example.test", RootCAs: roots, NextProtos: []string{"http/1.1"}})
		if err := conn.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, err
		}
		return conn, nil
	}
	var open *tls.Conn
	testcluster.Eventually(t, "the app over HTTPS with the first certificate", func() (bool, error) {
		conn, err := dialTLS(ca1)
		if err != nil {
			return false, nil
		}
		if code, body, err := roundTrip(conn); err != nil || code != http.StatusOK || !strings.HasPrefix(body, "app-") {
			conn.Close()
			return false, nil
		}
		open = conn
		return true, nil
	})
	defer open.Close()

	apply(t, n, tlsSecret("app-tls", cert2))
	testcluster.Eventually(t, "a new connection gets the rotated certificate", func() (bool, error) {
		conn, err := dialTLS(ca2)
		if err != nil {
			return false, nil
		}
		defer conn.Close()
		code, _, err := roundTrip(conn)
		return err == nil && code == http.StatusOK, nil
	})
	if code, body, err := roundTrip(open); err != nil || code != http.StatusOK || !strings.HasPrefix(body, "app-") {
		t.Errorf("the connection opened before the rotation: %d %q %v, want the app's answer", code, body, err)
	}

	// Status is written when it changes, not at every sync: a write
	// that the apiserver changed (a pruned or defaulted field) would
	// otherwise start the next sync, forever.
	versions := func() string {
		ctx := context.Background()
		gc, err1 := gw.GatewayV1().GatewayClasses().Get(ctx, "kelp", metav1.GetOptions{})
		g, err2 := gw.GatewayV1().Gateways("default").Get(ctx, "web", metav1.GetOptions{})
		r, err3 := gw.GatewayV1().HTTPRoutes("default").Get(ctx, "missing", metav1.GetOptions{})
		if err := errors.Join(err1, err2, err3); err != nil {
			t.Fatal(err)
		}
		return gc.ResourceVersion + " " + g.ResourceVersion + " " + r.ResourceVersion
	}
	before := versions()
	time.Sleep(3 * time.Second)
	if after := versions(); after != before {
		t.Errorf("resource versions of the GatewayClass, a Gateway and an HTTPRoute went from %s to %s with nothing changed", before, after)
	}
}

// roundTrip sends a GET / on conn, kept alive, and reads the answer.
func roundTrip(conn *tls.Conn) (int, string, error) {
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: app.example.test\r\n\r\n"); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// newServingCert makes a self-signed certificate for host and returns a
// pool that trusts it and the PEM pair.
func newServingCert(t *testing.T, host string) (*x509.CertPool, [2][]byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pool, [2][]byte{
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}
}

func tlsSecret(name string, pair [2][]byte) string {
	indent := func(b []byte) string {
		return "    " + strings.ReplaceAll(strings.TrimSpace(string(b)), "\n", "\n    ")
	}
	return fmt.Sprintf("apiVersion: v1\nkind: Secret\nmetadata: {name: %s}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n%s\n  tls.key: |\n%s\n", name, indent(pair[0]), indent(pair[1]))
}
