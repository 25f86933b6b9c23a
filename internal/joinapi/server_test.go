package joinapi

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/token"
)

// fakeMembers records the learners added and refuses names it has.
type fakeMembers struct {
	names []string
	added []string
}

func (f *fakeMembers) AddLearner(_ context.Context, name, peerURL string) (string, error) {
	for _, n := range f.names {
		if n == name {
			return "", fmt.Errorf("%w: a server named %q is", datastore.ErrMemberTaken, name)
		}
	}
	f.added = append(f.added, name+"="+peerURL)
	return "server=https://10.0.0.1:2380," + name + "=" + peerURL, nil
}

func serverJoinAs(s *joinAPI, header string, req ServerJoinRequest) *httptest.ResponseRecorder {
	body, _ := json.Marshal(req)
	r := httptest.NewRequest(http.MethodPost, ServerJoinPath, bytes.NewReader(body))
	r.Header.Set(TokenHeader, header)
	w := httptest.NewRecorder()
	s.serverJoin(w, r)
	return w
}

func TestServerJoin(t *testing.T) {
	good := ServerJoinRequest{Name: "server-2", PeerURL: "https://10.0.0.2:2380", ClusterCIDR: "10.42.0.0/16", ServiceCIDR: "10.43.0.0/16", ClusterDomain: "cluster.local"}
	with := func(change func(*ServerJoinRequest)) ServerJoinRequest {
		r := good
		change(&r)
		return r
	}
	for _, tc := range []struct {
		name      string
		datastore string
		header    string
		req       ServerJoinRequest
		want      int
		wantText  string
	}{
		{"server token", datastore.KindEtcd, "server:server-secret", good, http.StatusOK, ""},
		{"agent token", datastore.KindEtcd, "node:agent-secret", good, http.StatusUnauthorized, "join agents only"},
		{"server secret as a node", datastore.KindEtcd, "node:server-secret", good, http.StatusUnauthorized, "only the server token"},
		{"wrong secret", datastore.KindEtcd, "server:guess", good, http.StatusUnauthorized, "only the server token"},
		{"SQLite cluster", datastore.KindSQLite, "server:server-secret", good, http.StatusConflict, "--cluster-init"},
		{"other cluster CIDR", datastore.KindEtcd, "server:server-secret", with(func(r *ServerJoinRequest) { r.ClusterCIDR = "10.50.0.0/16" }), http.StatusConflict, "--cluster-cidr 10.42.0.0/16"},
		{"other service CIDR and domain", datastore.KindEtcd, "server:server-secret", with(func(r *ServerJoinRequest) { r.ServiceCIDR = "10.60.0.0/16"; r.ClusterDomain = "edge.local" }), http.StatusConflict, "--service-cidr 10.43.0.0/16 (this server has 10.60.0.0/16), --cluster-domain cluster.local"},
		{"name of a server", datastore.KindEtcd, "server:server-secret", with(func(r *ServerJoinRequest) { r.Name = "server" }), http.StatusConflict, "kubectl delete node server"},
		{"no etcd of its own", datastore.KindEtcd, "server:server-secret", with(func(r *ServerJoinRequest) { r.PeerURL = "" }), http.StatusConflict, "must run it too (no --datastore-endpoint)"},
		{"external datastore", datastore.KindPostgres, "server:server-secret", with(func(r *ServerJoinRequest) { r.PeerURL = "" }), http.StatusOK, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := testJoinAPI(t)
			s.cfg.Agent = AgentConfig{ClusterCIDR: "10.42.0.0/16", ServiceCIDR: "10.43.0.0/16", ClusterDomain: "cluster.local"}
			s.cfg.Datastore = tc.datastore
			s.cfg.EncryptionConfigFile = filepath.Join(t.TempDir(), "encryption-config.json")
			if err := os.WriteFile(s.cfg.EncryptionConfigFile, []byte(`{"kind":"EncryptionConfiguration"}`), 0o600); err != nil {
				t.Fatal(err)
			}
			members := &fakeMembers{names: []string{"server"}}
			if tc.datastore == datastore.KindEtcd {
				s.cfg.Members = members
			}
			w := serverJoinAs(s, tc.header, tc.req)
			if w.Code != tc.want || !strings.Contains(w.Body.String(), tc.wantText) {
				t.Fatalf("status %d %q, want %d with %q", w.Code, w.Body.String(), tc.want, tc.wantText)
			}
			if tc.want != http.StatusOK {
				if len(members.added) > 0 {
					t.Errorf("a refused join added the learner %v", members.added)
				}
				return
			}
			var resp ServerJoinResponse
			if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil {
				t.Fatal(err)
			}
			if len(resp.Authorities.ServerCA.Key) == 0 || len(resp.Authorities.ServiceAccountKey) == 0 || resp.AgentToken != "agent-secret" || !strings.Contains(string(resp.EncryptionConfig), "EncryptionConfiguration") {
				t.Errorf("the response lacks the cluster's authorities or agent token: %+v", resp)
			}
			if tc.datastore == datastore.KindEtcd && resp.InitialCluster != "server=https://10.0.0.1:2380,server-2=https://10.0.0.2:2380" {
				t.Errorf("initial cluster %q", resp.InitialCluster)
			}
		})
	}
}

// TestServerJoinAgentTokens offers a server join the tokens that join
// agents, each first shown to join an agent: the agent token and a live
// token of `kelp token create`, as a node and, as a short form is sent,
// as the server.
func TestServerJoinAgentTokens(t *testing.T) {
	s, client := testJoinAPI(t)
	s.cfg.Agent = AgentConfig{ClusterCIDR: "10.42.0.0/16", ServiceCIDR: "10.43.0.0/16", ClusterDomain: "cluster.local"}
	s.cfg.Datastore = datastore.KindEtcd
	members := &fakeMembers{}
	s.cfg.Members = members
	bootstrap, err := token.CreateBootstrap(t.Context(), client, time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	req := ServerJoinRequest{Name: "server-2", PeerURL: "https://10.0.0.2:2380", ClusterCIDR: "10.42.0.0/16", ServiceCIDR: "10.43.0.0/16", ClusterDomain: "cluster.local"}
	for i, secret := range []string{"agent-secret", bootstrap} {
		agent := JoinRequest{NodeName: fmt.Sprintf("agent-%d", i), Password: "0123456789abcdef0123"}
		if w := joinAs(s, "node:"+secret, agent); w.Code != http.StatusOK {
			t.Fatalf("%s does not join an agent: %d %s", secret, w.Code, w.Body)
		}
		for _, header := range []string{"node:" + secret, "server:" + secret} {
			w := serverJoinAs(s, header, req)
			if w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), "only the server token (<data-dir>/server/token on a server) joins servers") {
				t.Errorf("a server joining with %q: %d %.200q, want 401 saying a server needs the server token", header, w.Code, w.Body)
			}
		}
	}
	if len(members.added) > 0 {
		t.Errorf("a refused join added the learner %v", members.added)
	}
}

// identityLease is the identity lease of a kube-apiserver on hostname,
// last renewed at renewed.
func identityLease(name, hostname string, renewed time.Time) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", Labels: map[string]string{
			"apiserver.kubernetes.io/identity": "kube-apiserver",
			"kubernetes.io/hostname":           hostname,
		}},
		Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: renewed}},
	}
}

func TestServerJoinHostname(t *testing.T) {
	running := identityLease("apiserver-a", "pi", time.Now())
	gone := identityLease("apiserver-b", "old-pi", time.Now().Add(-5*time.Minute))
	for _, tc := range []struct {
		name     string
		hostname string
		want     int
		wantText string
	}{
		{"a running server's", "pi", http.StatusConflict, "hostname of its own"},
		{"a stopped server's", "old-pi", http.StatusOK, ""},
		{"its own", "pi-2", http.StatusOK, ""},
		{"not sent, by an older kelp", "", http.StatusOK, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := testJoinAPI(t, running, gone)
			s.cfg.Agent = AgentConfig{ClusterCIDR: "10.42.0.0/16", ServiceCIDR: "10.43.0.0/16", ClusterDomain: "cluster.local"}
			s.cfg.Datastore = datastore.KindEtcd
			members := &fakeMembers{}
			s.cfg.Members = members
			req := ServerJoinRequest{Name: "server-2", Hostname: tc.hostname, PeerURL: "https://10.0.0.2:2380", ClusterCIDR: "10.42.0.0/16", ServiceCIDR: "10.43.0.0/16", ClusterDomain: "cluster.local"}
			w := serverJoinAs(s, "server:server-secret", req)
			if w.Code != tc.want || !strings.Contains(w.Body.String(), tc.wantText) {
				t.Fatalf("status %d %q, want %d with %q", w.Code, w.Body.String(), tc.want, tc.wantText)
			}
			if tc.want != http.StatusOK && len(members.added) > 0 {
				t.Errorf("a refused join added the learner %v", members.added)
			}
		})
	}
}

// A joining server's node name is the server's as soon as it joins, not
// at its first start: until then an agent token could take it, and with
// it system:node:<name>.
func TestServerJoinClaimsNodeName(t *testing.T) {
	s, client := testJoinAPI(t)
	s.cfg.Agent = AgentConfig{ClusterCIDR: "10.42.0.0/16", ServiceCIDR: "10.43.0.0/16", ClusterDomain: "cluster.local"}
	s.cfg.Datastore = datastore.KindEtcd
	s.cfg.Members = &fakeMembers{}
	req := ServerJoinRequest{Name: "server-2", NodeName: "server-2", PeerURL: "https://10.0.0.2:2380", ClusterCIDR: "10.42.0.0/16", ServiceCIDR: "10.43.0.0/16", ClusterDomain: "cluster.local"}
	if w := serverJoinAs(s, "server:server-secret", req); w.Code != http.StatusOK {
		t.Fatalf("server join: %d %s", w.Code, w.Body)
	}
	w := joinAs(s, "node:agent-secret", JoinRequest{NodeName: "server-2", Password: "an-agents-password"})
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), `"server-2" is the node of a server`) {
		t.Errorf("an agent joining under the node name of a server that joined but has not started: %d %s", w.Code, w.Body)
	}
	if _, err := client.CoreV1().Secrets("kube-system").Get(t.Context(), "server-2.node-password.kelp", metav1.GetOptions{}); err != nil {
		t.Errorf("no claim of server-2's node name: %v", err)
	}
}

func witnessJoinAs(s *joinAPI, header string, req WitnessJoinRequest) *httptest.ResponseRecorder {
	body, _ := json.Marshal(req)
	r := httptest.NewRequest(http.MethodPost, WitnessJoinPath, bytes.NewReader(body))
	r.Header.Set(TokenHeader, header)
	w := httptest.NewRecorder()
	s.witnessJoin(w, r)
	return w
}

// A witness joins with the server token alone, into embedded etcd alone,
// and gets its etcd certificates for its address: no CA key, nothing of
// the control plane's.
func TestWitnessJoin(t *testing.T) {
	good := WitnessJoinRequest{Name: "pi", PeerURL: "https://10.0.0.9:2380"}
	for _, tc := range []struct {
		name      string
		datastore string
		header    string
		req       WitnessJoinRequest
		want      int
		wantText  string
	}{
		{"server token", datastore.KindEtcd, "server:server-secret", good, http.StatusOK, ""},
		{"agent token", datastore.KindEtcd, "node:agent-secret", good, http.StatusUnauthorized, "a witness joins with the server token"},
		{"server secret as a node", datastore.KindEtcd, "node:server-secret", good, http.StatusUnauthorized, "a witness joins with the server token"},
		{"SQLite cluster", datastore.KindSQLite, "server:server-secret", good, http.StatusConflict, "start the cluster's first server with --cluster-init"},
		{"external datastore", datastore.KindPostgres, "server:server-secret", good, http.StatusConflict, "a witness is a member of embedded etcd"},
		{"a name taken", datastore.KindEtcd, "server:server-secret", WitnessJoinRequest{Name: "taken", PeerURL: good.PeerURL}, http.StatusConflict, "another --node-name"},
		{"a bad name", datastore.KindEtcd, "server:server-secret", WitnessJoinRequest{Name: "Pi_Zero", PeerURL: good.PeerURL}, http.StatusConflict, `witness name "Pi_Zero"`},
		{"a host name as peer", datastore.KindEtcd, "server:server-secret", WitnessJoinRequest{Name: "pi", PeerURL: "https://pi.local:2380"}, http.StatusConflict, "is not https://<ip>:<port>"},
		{"plain http", datastore.KindEtcd, "server:server-secret", WitnessJoinRequest{Name: "pi", PeerURL: "http://10.0.0.9:2380"}, http.StatusConflict, "is not https://<ip>:<port>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := testJoinAPI(t)
			s.cfg.Datastore = tc.datastore
			members := &fakeMembers{names: []string{datastore.WitnessMember("taken")}}
			if tc.datastore == datastore.KindEtcd {
				s.cfg.Members = members
			}
			w := witnessJoinAs(s, tc.header, tc.req)
			if w.Code != tc.want || !strings.Contains(w.Body.String(), tc.wantText) {
				t.Fatalf("status %d %q, want %d with %q", w.Code, w.Body.String(), tc.want, tc.wantText)
			}
			if tc.want != http.StatusOK {
				if len(members.added) > 0 {
					t.Errorf("a refused join added the learner %v", members.added)
				}
				return
			}
			if want := []string{"witness/pi=https://10.0.0.9:2380"}; fmt.Sprint(members.added) != fmt.Sprint(want) {
				t.Errorf("added %v, want %v", members.added, want)
			}
			var fields map[string]json.RawMessage
			if err := json.Unmarshal(w.Body.Bytes(), &fields); err != nil {
				t.Fatal(err)
			}
			if len(fields) != 2 || fields["initialCluster"] == nil || fields["certs"] == nil {
				t.Errorf("the answer holds %v, want the initial cluster and the witness's certificates only", slices.Sorted(maps.Keys(fields)))
			}
			var resp WitnessJoinResponse
			if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil {
				t.Fatal(err)
			}
			for what, ca := range map[string][]byte{"etcd server CA": resp.Certs.EtcdServerCA, "etcd peer CA": resp.Certs.EtcdPeerCA} {
				if len(ca) == 0 || bytes.Contains(ca, []byte("PRIVATE KEY")) {
					t.Errorf("the %s sent: %q, want its certificate alone", what, ca)
				}
			}
			for _, c := range []struct {
				what string
				pem  []byte
				ca   string
			}{
				{"server", resp.Certs.Server.Cert, s.cfg.Certs.EtcdServerCA.Cert},
				{"peer", resp.Certs.Peer.Cert, s.cfg.Certs.EtcdPeerCA.Cert},
			} {
				cert := parseCertPEM(t, c.pem)
				if len(cert.IPAddresses) != 2 || (cert.IPAddresses[0].String() != "10.0.0.9" && cert.IPAddresses[1].String() != "10.0.0.9") {
					t.Errorf("the %s certificate names %v, want 10.0.0.9 and 127.0.0.1", c.what, cert.IPAddresses)
				}
				ca, err := os.ReadFile(c.ca)
				if err != nil {
					t.Fatal(err)
				}
				pool := x509.NewCertPool()
				pool.AppendCertsFromPEM(ca)
				if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
					t.Errorf("the %s certificate: %v", c.what, err)
				}
			}
		})
	}
}

func parseCertPEM(t *testing.T, data []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("no PEM in %q", data)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}
