package joinapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/token"
)

// ServerJoinPath is where another server joins the control plane.
const ServerJoinPath = "/v1-kelp/server-join"

// Members adds servers to the cluster's embedded etcd (datastore.Members).
type Members interface {
	AddLearner(ctx context.Context, name, peerURL string) (initialCluster string, err error)
}

// ServerJoinRequest is what a server sends to join. The settings every
// server must share are checked by the server it joins through.
type ServerJoinRequest struct {
	Name string `json:"name"`
	// Hostname is the joining machine's. Each server needs its own:
	// upstream derives the apiserver's identity and the leader-election
	// identities from it. Empty from a kelp that did not send it.
	Hostname string `json:"hostname,omitempty"`
	// NodeName is the joining server's own node, claimed for it as it
	// joins (ClaimServerNode); empty without one (--disable-agent).
	NodeName string `json:"nodeName,omitempty"`
	// PeerURL is where etcd peers reach the new member; empty when it
	// runs on an external datastore.
	PeerURL       string `json:"peerURL"`
	ClusterCIDR   string `json:"clusterCIDR"`
	ServiceCIDR   string `json:"serviceCIDR"`
	ClusterDomain string `json:"clusterDomain"`
}

// ServerJoinResponse is what a joining server gets.
type ServerJoinResponse struct {
	// Datastore is the cluster's datastore kind.
	Datastore string `json:"datastore"`
	// InitialCluster is the etcd membership the new member starts with,
	// itself included; empty on an external datastore.
	InitialCluster string          `json:"initialCluster,omitempty"`
	Authorities    pki.Authorities `json:"authorities"`
	// AgentToken is the secret of the cluster's agent token; empty: none.
	AgentToken string `json:"agentToken,omitempty"`
	// EncryptionConfig holds the keys Secrets are encrypted with; empty:
	// none.
	EncryptionConfig []byte `json:"encryptionConfig,omitempty"`
}

// serverTokenPost answers a request to a path only the server token may
// post to, unless it is one: a method other than POST, a source that
// guessed wrong too often, a token other than the server token (told
// wrongToken, or the error itself if empty) or none to check it against.
// who ("server", "witness") names the one that joins in the log.
func (s *joinAPI) serverTokenPost(w http.ResponseWriter, r *http.Request, who, wrongToken string) bool {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return false
	}
	src, id := sourceOf(r.RemoteAddr), tokenID(r.Header.Get(TokenHeader))
	if wait, ok := s.limit.retryAfter(src, id); ok {
		tooManyWrongTokens(w, wait)
		return false
	}
	switch err := s.serverAuthorized(r.Header.Get(TokenHeader)); {
	case errors.Is(err, errNotServerToken):
		s.limit.failed(src, id, r.RemoteAddr, "a "+who+" tried to join with a token other than the server token")
		if wrongToken == "" {
			wrongToken = err.Error()
		}
		http.Error(w, wrongToken, http.StatusUnauthorized)
		return false
	case err != nil:
		status := http.StatusUnauthorized
		if errors.Is(err, errNoServerToken) {
			status = http.StatusServiceUnavailable
		}
		log.WithError(err).WithField("from", r.RemoteAddr).Warn(who + " join refused")
		http.Error(w, err.Error(), status)
		return false
	}
	s.limit.succeeded(src, id)
	return true
}

// errSettings is a joining server whose settings differ from the cluster's.
var errSettings = errors.New("settings differ from the cluster's")

func (s *joinAPI) serverJoin(w http.ResponseWriter, r *http.Request) {
	if !s.serverTokenPost(w, r, "server", "") {
		return
	}
	var req ServerJoinRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
		http.Error(w, "malformed join request: "+err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := s.admitServer(r.Context(), req)
	if err != nil {
		status := http.StatusConflict
		if errors.Is(err, errUnavailable) {
			status = http.StatusServiceUnavailable
		}
		log.WithError(err).WithField("server", req.Name).Warn("server join refused")
		http.Error(w, err.Error(), status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
	log.WithFields(logrus.Fields{"server": req.Name, "peer": req.PeerURL}).Info("server joined")
}

// serverAuthorized accepts the server token only: the CA keys a server
// gets are the whole cluster.
func (s *joinAPI) serverAuthorized(header string) error {
	user, secret, _ := strings.Cut(header, ":")
	server, err := readSecret(s.cfg.TokenFile)
	if err != nil {
		return fmt.Errorf("the server token: %w", err)
	}
	if server == "" {
		return fmt.Errorf("%w: %s", errNoServerToken, s.cfg.TokenFile)
	}
	if user != token.ServerUser || !token.Equal(secret, server) {
		return errNotServerToken
	}
	return nil
}

var errNotServerToken = errors.New("only the server token (<data-dir>/server/token on a server) joins servers; agent tokens and `kelp token create` tokens join agents only")

// errUnavailable is a join that may work when tried again.
var errUnavailable = errors.New("try again")

// admitServer checks that the server fits the cluster and, on embedded
// etcd, adds it as a learner.
func (s *joinAPI) admitServer(ctx context.Context, req ServerJoinRequest) (ServerJoinResponse, error) {
	if errs := validation.IsDNS1123Subdomain(req.Name); len(errs) > 0 {
		return ServerJoinResponse{}, fmt.Errorf("server name %q: %s", req.Name, strings.Join(errs, "; "))
	}
	if s.cfg.Datastore == datastore.KindSQLite {
		return ServerJoinResponse{}, errors.New("this cluster keeps its state in SQLite, which only one server can use: " +
			"a cluster with several servers needs embedded etcd (start its first server with --cluster-init) or an external datastore shared by all servers (--datastore-endpoint); " +
			"to move this cluster, take a `kelp snapshot save`, and recreate its objects on a new cluster")
	}
	var diffs []string
	for _, d := range []struct{ flag, cluster, joiner string }{
		{"--cluster-cidr", s.cfg.Agent.ClusterCIDR, req.ClusterCIDR},
		{"--service-cidr", s.cfg.Agent.ServiceCIDR, req.ServiceCIDR},
		{"--cluster-domain", s.cfg.Agent.ClusterDomain, req.ClusterDomain},
	} {
		if d.cluster != d.joiner {
			diffs = append(diffs, fmt.Sprintf("%s %s (this server has %s)", d.flag, d.cluster, d.joiner))
		}
	}
	if len(diffs) > 0 {
		return ServerJoinResponse{}, fmt.Errorf("%w: start it with %s", errSettings, strings.Join(diffs, ", "))
	}
	if err := s.hostnameFree(ctx, req.Hostname); err != nil {
		return ServerJoinResponse{}, err
	}
	if req.NodeName != "" {
		// Now, not at the server's first start: until then an agent
		// token could claim the name.
		if err := ClaimServerNode(ctx, s.cfg.Admin, req.NodeName); err != nil {
			return ServerJoinResponse{}, fmt.Errorf("%w: %v", errUnavailable, err)
		}
	}
	authorities, err := pki.ReadAuthorities(s.cfg.Certs)
	if err != nil {
		return ServerJoinResponse{}, fmt.Errorf("%w: %v", errUnavailable, err)
	}
	agent, err := readSecret(s.cfg.AgentTokenFile)
	if err != nil {
		return ServerJoinResponse{}, fmt.Errorf("%w: the agent token: %v", errUnavailable, err)
	}
	encryption, err := os.ReadFile(s.cfg.EncryptionConfigFile)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return ServerJoinResponse{}, fmt.Errorf("%w: the encryption configuration: %v", errUnavailable, err)
	}
	resp := ServerJoinResponse{Datastore: s.cfg.Datastore, Authorities: authorities, AgentToken: agent, EncryptionConfig: encryption}
	if s.cfg.Members == nil {
		if req.PeerURL != "" {
			return ServerJoinResponse{}, fmt.Errorf("this cluster's datastore is external (%s): start the server with the same --datastore-endpoint as the others", s.cfg.Datastore)
		}
		return resp, nil
	}
	if u, err := url.Parse(req.PeerURL); err != nil || u.Scheme != "https" || u.Port() == "" {
		return ServerJoinResponse{}, fmt.Errorf("this cluster's datastore is embedded etcd: the joining server must run it too (no --datastore-endpoint); its etcd peer URL %q is not https://<ip>:<port>", req.PeerURL)
	}
	resp.InitialCluster, err = s.cfg.Members.AddLearner(ctx, req.Name, req.PeerURL)
	if err != nil {
		return ServerJoinResponse{}, s.memberError(req.Name, err)
	}
	return resp, nil
}

// hostnameHeld is how long after its apiserver's last renewal of its
// identity lease (every 10 s) a server still holds its hostname.
const hostnameHeld = 30 * time.Second

// hostnameFree refuses a hostname that a running server has: the two
// would take each other's leader leases, and their apiservers would
// overwrite one identity lease.
func (s *joinAPI) hostnameFree(ctx context.Context, hostname string) error {
	if hostname == "" {
		return nil
	}
	leases, err := s.cfg.Admin.CoordinationV1().Leases(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{LabelSelector: apiserverIdentity})
	if err != nil {
		return fmt.Errorf("%w: list the apiservers' identity leases: %v", errUnavailable, err)
	}
	for _, l := range leases.Items {
		if l.Labels[corev1.LabelHostname] != hostname || l.Spec.RenewTime == nil {
			continue
		}
		if ago := time.Since(l.Spec.RenewTime.Time); ago < hostnameHeld {
			return fmt.Errorf("%w: a server with the hostname %q runs already (its apiserver renewed its identity %s ago): "+
				"give this machine a hostname of its own (hostnamectl set-hostname NAME, or /etc/hostname) and start it again; "+
				"if that server was this machine, start again in %s",
				errHostnameTaken, hostname, ago.Round(time.Second), hostnameHeld)
		}
	}
	return nil
}

// apiserverIdentity selects the identity leases of kube-apiservers.
const apiserverIdentity = "apiserver.kubernetes.io/identity=kube-apiserver"

// errHostnameTaken is a joining server whose hostname another runs with.
var errHostnameTaken = errors.New("hostname taken")

// memberError says what to do about a refused etcd member.
func (s *joinAPI) memberError(name string, err error) error {
	if errors.Is(err, datastore.ErrMemberTaken) {
		return fmt.Errorf("%w: give this server another --node-name, or, if it replaces that server, remove the old one first with `kubectl delete node %s`", err, name)
	}
	return fmt.Errorf("%w: %w", errUnavailable, err)
}
