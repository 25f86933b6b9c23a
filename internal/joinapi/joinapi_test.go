package joinapi

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	genericrequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/testlog"
	"github.com/kelp-dev/kelp/internal/token"
)

func testJoinAPI(t *testing.T, objects ...any) (*joinAPI, *fake.Clientset) {
	t.Helper()
	dir := t.TempDir()
	certs, err := pki.Ensure(testPKI(dir))
	if err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset()
	for _, o := range objects {
		switch o := o.(type) {
		case *corev1.Node:
			_ = client.Tracker().Add(o)
		case *corev1.Secret:
			_ = client.Tracker().Add(o)
		case *coordinationv1.Lease:
			_ = client.Tracker().Add(o)
		}
	}
	tokens := filepath.Join(dir, "token")
	if err := os.WriteFile(tokens, []byte("KELP1"+strings.Repeat("a", 64)+"::server:server-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	agentTokens := filepath.Join(dir, "agent-token")
	if err := os.WriteFile(agentTokens, []byte("agent-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &joinAPI{cfg: Config{Certs: certs, TokenFile: tokens, AgentTokenFile: agentTokens, Agent: AgentConfig{ClusterCIDR: "10.42.0.0/16"}, Admin: client}, slots: make(chan struct{}, maxJoins)}
	return s, client
}

// testPKI is the PKI of testJoinAPI's server, in dir.
func testPKI(dir string) pki.Config {
	return pki.Config{Dir: filepath.Join(dir, "tls"), Hostname: "server", ServiceIP: []byte{10, 43, 0, 1}, ClusterDomain: "cluster.local"}
}

func joinAs(s *joinAPI, tokenHeader string, req JoinRequest) *httptest.ResponseRecorder {
	body, _ := json.Marshal(req)
	r := httptest.NewRequest(http.MethodPost, JoinPath, bytes.NewReader(body))
	if tokenHeader != "" {
		r.Header.Set(TokenHeader, tokenHeader)
	}
	w := httptest.NewRecorder()
	s.join(w, r)
	return w
}

func TestJoin(t *testing.T) {
	s, client := testJoinAPI(t)
	req := JoinRequest{NodeName: "agent-1", NodeIPs: []string{"10.99.0.3"}, Password: "0123456789abcdef0123"}
	bootstrap, err := token.CreateBootstrap(t.Context(), client, time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, header string
		want         int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"wrong secret", "node:guess", http.StatusUnauthorized},
		{"agent token as the server", "server:agent-secret", http.StatusUnauthorized},
		{"unknown user", "admin:server-secret", http.StatusUnauthorized},
		{"agent token", "node:agent-secret", http.StatusOK},
		{"server token", "node:server-secret", http.StatusOK},
		{"a bootstrap token nobody made", "node:abcdef.0123456789abcdef", http.StatusUnauthorized},
		{"a bootstrap token", "node:" + bootstrap, http.StatusOK},
	} {
		if w := joinAs(s, tc.header, req); w.Code != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, w.Code, w.Body, tc.want)
		}
	}
	w := joinAs(s, "node:agent-secret", req)
	var resp JoinResponse
	if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Config.ClusterCIDR != "10.42.0.0/16" || len(resp.ServerCA) == 0 || len(resp.ClientCA) == 0 || len(resp.Certs.KubeletClient.Key) == 0 {
		t.Errorf("join answered %+v", resp.Config)
	}
	if _, err := client.CoreV1().Secrets("kube-system").Get(t.Context(), "agent-1.node-password.kelp", metav1.GetOptions{}); err != nil {
		t.Errorf("no password Secret: %v", err)
	}

	for _, bad := range []JoinRequest{
		{NodeName: "Not_A_Name", Password: req.Password},
		{NodeName: "agent-2", Password: "short"},
		{NodeName: "agent-2", Password: req.Password, NodeIPs: []string{"10.99.0.300"}},
	} {
		if w := joinAs(s, "node:agent-secret", bad); w.Code != http.StatusBadRequest {
			t.Errorf("%+v: %d, want 400", bad, w.Code)
		}
	}
}

// TestJoinDualStack: a dual-stack cluster's ranges reach a node as comma
// lists; a node whose kelp predates them (no cidrLists in its request)
// would read one and is refused with what to do.
func TestJoinDualStack(t *testing.T) {
	s, _ := testJoinAPI(t)
	s.cfg.Agent.ClusterCIDR = "10.42.0.0/16,fd42::/56"
	s.cfg.Agent.ServiceCIDR = "10.43.0.0/16,fd43::/112"
	old := JoinRequest{NodeName: "agent-1", NodeIPs: []string{"10.99.0.3", "fd99::3"}, Password: "0123456789abcdef0123"}
	w := joinAs(s, "node:agent-secret", old)
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "this cluster is dual-stack (--cluster-cidr 10.42.0.0/16,fd42::/56), which the kelp on node agent-1 predates: install the servers' kelp on the node") {
		t.Errorf("a node of an earlier kelp: %d %s", w.Code, w.Body)
	}
	// A request without the field is one of an earlier kelp.
	if data, _ := json.Marshal(old); strings.Contains(string(data), "cidrLists") {
		t.Errorf("a request of an earlier kelp carries %s", data)
	}
	current := old
	current.CIDRLists = true
	w = joinAs(s, "node:agent-secret", current)
	var resp JoinResponse
	if err := json.Unmarshal(w.Body.Bytes(), &resp); w.Code != http.StatusOK || err != nil {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if resp.Config.ClusterCIDR != "10.42.0.0/16,fd42::/56" || resp.Config.ServiceCIDR != "10.43.0.0/16,fd43::/112" {
		t.Errorf("join answered %+v", resp.Config)
	}
	// An IPv4 cluster takes the earlier kelp as before.
	s.cfg.Agent.ClusterCIDR, s.cfg.Agent.ServiceCIDR = "10.42.0.0/16", "10.43.0.0/16"
	if w := joinAs(s, "node:agent-secret", old); w.Code != http.StatusOK {
		t.Errorf("an earlier kelp into an IPv4 cluster: %d %s", w.Code, w.Body)
	}
}

// TestJoinResponseWire pins the join API's JSON: nodes and servers of
// different kelp versions speak it, so renaming a Go field must not rename
// a key.
func TestJoinResponseWire(t *testing.T) {
	pem := func(s string) pki.PEMPair { return pki.PEMPair{Cert: []byte(s + ".crt"), Key: []byte(s + ".key")} }
	resp := JoinResponse{
		Config: AgentConfig{
			Servers: []string{"https://10.0.0.1:6443"}, ClusterCIDR: "10.42.0.0/16", ServiceCIDR: "10.43.0.0/16",
			ClusterDNS: "10.43.0.10", ClusterDomain: "cluster.local", Overlay: "vxlan", DisableDNS: true, DisableNetworkPolicy: true,
			EmbeddedRegistry: true, DisableGateway: true,
		},
		ServerCA: []byte("server-ca"),
		ClientCA: []byte("client-ca"),
		Certs: pki.NodeCerts{
			KubeletClient: pem("kc"), KubeletServing: pem("ks"), Proxy: pem("p"), DNS: pem("d"), Controller: pem("c"),
		},
	}
	got, err := json.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	want := `{
		"config": {"servers": ["https://10.0.0.1:6443"], "clusterCIDR": "10.42.0.0/16", "serviceCIDR": "10.43.0.0/16",
			"clusterDNS": "10.43.0.10", "clusterDomain": "cluster.local", "overlay": "vxlan", "disableDNS": true, "disableNetworkPolicy": true,
			"embeddedRegistry": true, "disableGateway": true},
		"serverCA": "c2VydmVyLWNh",
		"clientCA": "Y2xpZW50LWNh",
		"certs": {
			"KubeletClient": {"Cert": "a2MuY3J0", "Key": "a2Mua2V5"},
			"KubeletServing": {"Cert": "a3MuY3J0", "Key": "a3Mua2V5"},
			"Proxy": {"Cert": "cC5jcnQ=", "Key": "cC5rZXk="},
			"DNS": {"Cert": "ZC5jcnQ=", "Key": "ZC5rZXk="},
			"Controller": {"Cert": "Yy5jcnQ=", "Key": "Yy5rZXk="}
		}
	}`
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(want)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, compact.Bytes()) {
		t.Errorf("JoinResponse is\n%s\nwant\n%s", got, compact.Bytes())
	}
}

// A node's name belongs to the machine that joined under it first, until
// its Node is deleted.
func TestJoinNodeName(t *testing.T) {
	s, client := testJoinAPI(t)
	first := JoinRequest{NodeName: "agent-1", Password: "first-machine-password"}
	second := JoinRequest{NodeName: "agent-1", Password: "second-machine-password"}
	if w := joinAs(s, "node:agent-secret", first); w.Code != http.StatusOK {
		t.Fatalf("first join: %d %s", w.Code, w.Body)
	}
	if _, err := client.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "agent-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w := joinAs(s, "node:agent-secret", second)
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "kubectl delete node agent-1") {
		t.Errorf("another machine took the name: %d %s", w.Code, w.Body)
	}
	// The same machine with a lost password looks the same to the server:
	// the refusal names how to let it in for that case.
	if want := "kubectl -n kube-system annotate secret agent-1.node-password.kelp kelp.io/node-password-reset=true"; !strings.Contains(w.Body.String(), want) {
		t.Errorf("the refusal does not say %q: %s", want, w.Body)
	}
	if w := joinAs(s, "node:agent-secret", first); w.Code != http.StatusOK {
		t.Errorf("the first machine again: %d %s", w.Code, w.Body)
	}

	// A Node without a password Secret is nobody's to take.
	if err := client.CoreV1().Secrets("kube-system").Delete(t.Context(), "agent-1.node-password.kelp", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if w := joinAs(s, "node:agent-secret", second); w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "has no node password") {
		t.Errorf("a first claim of an existing Node's name: %d %s, want refused", w.Code, w.Body)
	}
	if err := client.CoreV1().Nodes().Delete(t.Context(), "agent-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if w := joinAs(s, "node:agent-secret", second); w.Code != http.StatusOK {
		t.Errorf("after kubectl delete node: %d %s", w.Code, w.Body)
	}
	if w := joinAs(s, "node:agent-secret", first); w.Code != http.StatusOK {
		// The Node is gone, so the name is free again for anyone.
		t.Errorf("the first machine after the second: %d %s", w.Code, w.Body)
	}
}

func TestPublicRoutes(t *testing.T) {
	s, _ := testJoinAPI(t)
	routes := Routes(s.cfg)
	w := httptest.NewRecorder()
	routes[CACertsPath].ServeHTTP(w, httptest.NewRequest(http.MethodGet, CACertsPath, nil))
	ca, _ := os.ReadFile(s.cfg.Certs.ServerCA.Cert)
	if w.Code != http.StatusOK || !bytes.Equal(w.Body.Bytes(), ca) {
		t.Errorf("/cacerts: %d, %d bytes", w.Code, w.Body.Len())
	}
	w = httptest.NewRecorder()
	routes[PingPath].ServeHTTP(w, httptest.NewRequest(http.MethodGet, PingPath, nil))
	if strings.TrimSpace(w.Body.String()) != "pong" {
		t.Errorf("/ping: %q", w.Body)
	}
}

// A machine that lost its node password gets back in, Node and all, once
// its password Secret is marked for a reset as the refusal says.
func TestJoinLostPassword(t *testing.T) {
	s, client := testJoinAPI(t)
	before := JoinRequest{NodeName: "agent-1", Password: "password-before-the-power-cut"}
	after := JoinRequest{NodeName: "agent-1", Password: "password-made-after-the-power-cut"}
	if w := joinAs(s, "node:agent-secret", before); w.Code != http.StatusOK {
		t.Fatalf("first join: %d %s", w.Code, w.Body)
	}
	if _, err := client.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "agent-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if w := joinAs(s, "node:agent-secret", after); w.Code != http.StatusConflict {
		t.Fatalf("a new password for a known node: %d %s", w.Code, w.Body)
	}
	secret, err := client.CoreV1().Secrets("kube-system").Get(t.Context(), "agent-1.node-password.kelp", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secret.Annotations = map[string]string{passwordResetAnnotation: "true"}
	if _, err := client.CoreV1().Secrets("kube-system").Update(t.Context(), secret, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if w := joinAs(s, "node:agent-secret", after); w.Code != http.StatusOK {
		t.Errorf("after marking the password Secret for a reset: %d %s", w.Code, w.Body)
	}
	// The mark lets one join in.
	if w := joinAs(s, "node:agent-secret", before); w.Code != http.StatusConflict {
		t.Errorf("the old password after the reset: %d %s, want refused", w.Code, w.Body)
	}
	if _, err := client.CoreV1().Nodes().Get(t.Context(), "agent-1", metav1.GetOptions{}); err != nil {
		t.Errorf("the Node is gone: %v", err)
	}
}

// A missing or empty token file is no token: the other tokens still join,
// and a token that may be the unknown server token gets a clear 503 (the
// node tries again) rather than a refusal or a nil error in the log.
func TestJoinTokenFileMissingOrEmpty(t *testing.T) {
	req := JoinRequest{NodeName: "agent-1", Password: "0123456789abcdef0123"}
	for _, damage := range []struct {
		name string
		do   func(path string) error
	}{
		{"missing", os.Remove},
		{"empty", func(path string) error { return os.WriteFile(path, nil, 0o600) }},
		{"blank", func(path string) error { return os.WriteFile(path, []byte("\n"), 0o600) }},
	} {
		t.Run("server token "+damage.name, func(t *testing.T) {
			s, _ := testJoinAPI(t)
			if err := damage.do(s.cfg.TokenFile); err != nil {
				t.Fatal(err)
			}
			hook := testlog.Capture(t)
			if w := joinAs(s, "node:agent-secret", req); w.Code != http.StatusOK {
				t.Errorf("the agent token: %d %s", w.Code, w.Body)
			}
			for _, header := range []string{"node:server-secret", "server:server-secret"} {
				w := joinAs(s, header, req)
				if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "token file is missing or empty") {
					t.Errorf("%s: %d %s", header, w.Code, w.Body)
				}
			}
			for _, e := range hook.AllEntries() {
				if line, _ := e.String(); strings.Contains(line, "%!") || strings.Contains(line, "<nil>") {
					t.Errorf("logged %s", line)
				}
				if err, _ := e.Data[logrus.ErrorKey].(error); e.Level == logrus.ErrorLevel && (err == nil || !strings.Contains(err.Error(), s.cfg.TokenFile)) {
					t.Errorf("the error does not name %s: %v", s.cfg.TokenFile, err)
				}
			}
		})
		t.Run("agent token "+damage.name, func(t *testing.T) {
			s, _ := testJoinAPI(t)
			if err := damage.do(s.cfg.AgentTokenFile); err != nil {
				t.Fatal(err)
			}
			for header, want := range map[string]int{"node:server-secret": http.StatusOK, "node:agent-secret": http.StatusUnauthorized, "node:guess": http.StatusUnauthorized} {
				if w := joinAs(s, header, req); w.Code != want {
					t.Errorf("%s: %d %s, want %d", header, w.Code, w.Body, want)
				}
			}
		})
	}
}

// A node that joined renews its certificates with its client certificate
// and its password, without a token: the server takes the node's name
// from the certificate the apiserver authenticated. Deleting the Node
// ends that.
func TestRenewWithNodeCertificate(t *testing.T) {
	s, client := testJoinAPI(t)
	req := JoinRequest{NodeName: "agent-1", NodeIPs: []string{"10.99.0.3"}, Password: "0123456789abcdef0123"}
	w := joinAs(s, "node:agent-secret", req)
	if w.Code != http.StatusOK {
		t.Fatalf("join: %d %s", w.Code, w.Body)
	}
	var joined JoinResponse
	if err := json.Unmarshal(w.Body.Bytes(), &joined); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "agent-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The apiserver in front of the join API authenticates client
	// certificates; this stands in for it.
	dir := t.TempDir()
	files := pki.NodeFilesIn(dir)
	if err := files.Write(joined.ServerCA, joined.ClientCA, joined.Certs); err != nil {
		t.Fatal(err)
	}
	front := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.PeerCertificates) > 0 {
			c := r.TLS.PeerCertificates[0]
			u := &user.DefaultInfo{Name: c.Subject.CommonName, Groups: append(c.Subject.Organization, "system:authenticated")}
			r = r.WithContext(genericrequest.WithUser(r.Context(), u))
		}
		s.join(w, r)
	}))
	serving, err := tls.LoadX509KeyPair(s.cfg.Certs.APIServer.Cert, s.cfg.Certs.APIServer.Key)
	if err != nil {
		t.Fatal(err)
	}
	clientCAs := x509.NewCertPool()
	clientCAs.AppendCertsFromPEM(joined.ClientCA)
	front.TLS = &tls.Config{Certificates: []tls.Certificate{serving}, ClientCAs: clientCAs, ClientAuth: tls.VerifyClientCertIfGiven}
	front.StartTLS()
	defer front.Close()

	renew := Client{Server: front.URL, CAFile: files.ServerCA, Cert: files.KubeletClient}
	var renewed JoinResponse
	if _, err := renew.Post(t.Context(), JoinPath, req, &renewed); err != nil {
		t.Fatalf("renew: %v", err)
	}
	if len(renewed.Certs.KubeletClient.Cert) == 0 || bytes.Equal(renewed.Certs.KubeletClient.Cert, joined.Certs.KubeletClient.Cert) {
		t.Error("the renewal answered no new client certificate")
	}

	for _, tc := range []struct {
		name   string
		client Client
		req    JoinRequest
		want   string
	}{
		{"another node's name", renew, JoinRequest{NodeName: "agent-2", Password: req.Password}, "renews only that node's certificates"},
		{"another password", renew, JoinRequest{NodeName: "agent-1", Password: "someone-elses-password"}, "joined before with another node password"},
		{"no certificate and no token", Client{Server: front.URL, CAFile: files.ServerCA}, req, "the token is not valid"},
		{"a certificate that is not a node's", Client{Server: front.URL, CAFile: files.ServerCA, Cert: files.Proxy}, req, "the token is not valid"},
	} {
		var resp JoinResponse
		_, err := tc.client.Post(t.Context(), JoinPath, tc.req, &resp)
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a refusal that says %q", tc.name, err, tc.want)
		}
	}

	// Deleting the Node stops its renewals; a token still joins it.
	if err := client.CoreV1().Nodes().Delete(t.Context(), "agent-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := renew.Post(t.Context(), JoinPath, req, &renewed); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "was deleted") {
		t.Errorf("renewal of a deleted node: %v", err)
	}
	if w := joinAs(s, "node:agent-secret", req); w.Code != http.StatusOK {
		t.Errorf("the deleted node with a token: %d %s", w.Code, w.Body)
	}
}

// TestJoinServerNodeName: an agent token cannot claim a server's node
// name, before or after the server's Node exists; a name an agent had
// claimed before the server took it is the server's again.
func TestJoinServerNodeName(t *testing.T) {
	s, client := testJoinAPI(t)
	agent := JoinRequest{NodeName: "server-1", Password: "an-agents-password"}
	if w := joinAs(s, "node:agent-secret", agent); w.Code != http.StatusOK {
		t.Fatalf("an agent's claim before any server: %d %s", w.Code, w.Body)
	}
	if err := ClaimServerNode(t.Context(), client, "server-1"); err != nil {
		t.Fatal(err)
	}
	for _, node := range []bool{false, true} {
		if node {
			if _, err := client.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "server-1"}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		w := joinAs(s, "node:agent-secret", agent)
		if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), `"server-1" is the node of a server`) {
			t.Errorf("an agent joining as a server's node (Node exists: %v): %d %s", node, w.Code, w.Body)
		}
	}
	// A restart of the server changes nothing.
	before, err := client.CoreV1().Secrets("kube-system").Get(t.Context(), "server-1.node-password.kelp", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ClaimServerNode(t.Context(), client, "server-1"); err != nil {
		t.Fatal(err)
	}
	after, err := client.CoreV1().Secrets("kube-system").Get(t.Context(), "server-1.node-password.kelp", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before.Data["hash"], after.Data["hash"]) {
		t.Errorf("a server's restart made a new claim")
	}
}

// A node asking for a serving certificate in the apiserver's names, for
// loopback or for 200 addresses is refused with the reason, before its
// name is claimed; one that asks for its own gets a certificate of the
// kubelet CA, which the server CA its clients trust does not verify.
func TestJoinServingCertificateNames(t *testing.T) {
	s, client := testJoinAPI(t)
	// Another server of the cluster, which this one's certificate does
	// not name.
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(t.Context(), &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "kubernetes", Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.99.0.7"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	many := make([]string, 200)
	for i := range many {
		many[i] = fmt.Sprintf("10.99.%d.%d", i/250, 1+i%250)
	}
	for _, tc := range []struct {
		name string
		req  JoinRequest
		want string
	}{
		{"the apiserver's service IP", JoinRequest{NodeName: "agent-1", NodeIPs: []string{"10.43.0.1"}}, "10.43.0.1 (an address of the apiserver)"},
		{"another server's address", JoinRequest{NodeName: "agent-1", NodeIPs: []string{"10.99.0.7"}}, "10.99.0.7 (an address of the apiserver)"},
		{"localhost", JoinRequest{NodeName: "localhost"}, "localhost (a loopback name)"},
		{"127.0.0.1", JoinRequest{NodeName: "agent-1", NodeIPs: []string{"127.0.0.1"}}, "127.0.0.1 (a loopback address)"},
		{"a name of the apiserver", JoinRequest{NodeName: "kubernetes.default.svc.cluster.local"}, "(a name of the apiserver)"},
		{"200 addresses", JoinRequest{NodeName: "agent-1", NodeIPs: many}, "asks for 201 names and addresses, at most 16 are allowed: give it fewer --node-ip"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Password = "0123456789abcdef0123"
			w := joinAs(s, "node:agent-secret", tc.req)
			if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), tc.want) {
				t.Errorf("%d %s, want 400 naming %q", w.Code, w.Body, tc.want)
			}
			secrets, _ := client.CoreV1().Secrets("kube-system").List(t.Context(), metav1.ListOptions{})
			if len(secrets.Items) != 0 {
				t.Errorf("a refused join claimed %s", secrets.Items[0].Name)
			}
		})
	}

	w := joinAs(s, "node:agent-secret", JoinRequest{NodeName: "agent-1", NodeIPs: []string{"10.99.0.3"}, Password: "0123456789abcdef0123"})
	var resp JoinResponse
	if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	leaf, err := tls.X509KeyPair(resp.Certs.KubeletServing.Cert, resp.Certs.KubeletServing.Key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(leaf.Certificate[0])
	if !slices.Equal(cert.DNSNames, []string{"agent-1"}) || len(cert.IPAddresses) != 1 || !cert.IPAddresses[0].Equal(net.ParseIP("10.99.0.3")) {
		t.Errorf("the serving certificate names %v %v, want agent-1 and 10.99.0.3 alone", cert.DNSNames, cert.IPAddresses)
	}
	for name, ca := range map[string]string{"the kubelet CA": s.cfg.Certs.KubeletCA.Cert, "the server CA": s.cfg.Certs.ServerCA.Cert} {
		data, err := os.ReadFile(ca)
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(data)
		_, err = cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		if verified := err == nil; verified != (name == "the kubelet CA") {
			t.Errorf("the serving certificate against %s: %v", name, err)
		}
	}
}
