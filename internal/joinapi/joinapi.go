package joinapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/validation"
	genericrequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/token"
)

// Paths the join API serves; anyone may reach them (RBAC), the join
// checks the token itself.
const (
	CACertsPath = "/cacerts"
	PingPath    = "/ping"
	JoinPath    = "/v1-kelp/join"
)

// TokenHeader carries "<user>:<secret>". Not Authorization: the apiserver
// removes that header from the requests it lets through.
const TokenHeader = "Kelp-Token"

// MinPasswordLength is the shortest node password the join API takes.
const MinPasswordLength = 16

// maxJoins bounds the joins signed at once, so that a hundred nodes
// booting together do not starve the apiserver they share a process with.
const maxJoins = 8

var log = logrus.WithField("component", "joinapi")

// Config is what the join API serves.
type Config struct {
	Certs pki.Files
	// TokenFile and AgentTokenFile hold the tokens nodes join with, read
	// at every join so that `kelp token rotate` applies at once; a
	// missing agent token file means none.
	TokenFile, AgentTokenFile string
	// Admin reaches the nodes' password Secrets and the tokens of `kelp
	// token create`.
	Admin kubernetes.Interface
	Agent AgentConfig
	// Datastore is the cluster's datastore kind (datastore.Kind*).
	Datastore string
	// Members adds joining servers to embedded etcd; nil on any other
	// datastore.
	Members Members
	// EncryptionConfigFile holds the keys Secrets are encrypted with, which
	// a joining server gets; a missing file means none.
	EncryptionConfigFile string
}

// AgentConfig is what a joining node learns of the cluster.
type AgentConfig struct {
	Servers []string `json:"servers"` // apiserver URLs
	// ClusterCIDR and ServiceCIDR are the flags' values: one CIDR, or an
	// IPv4 and an IPv6 one separated by a comma, the primary first. A kelp
	// from before dual-stack reads one only, so the server refuses its
	// join into a dual-stack cluster (JoinRequest.CIDRLists).
	ClusterCIDR          string `json:"clusterCIDR"`
	ServiceCIDR          string `json:"serviceCIDR"`
	ClusterDNS           string `json:"clusterDNS"`
	ClusterDomain        string `json:"clusterDomain"`
	Overlay              string `json:"overlay"`
	DisableDNS           bool   `json:"disableDNS"`
	DisableNetworkPolicy bool   `json:"disableNetworkPolicy"`
	EmbeddedRegistry     bool   `json:"embeddedRegistry"`
	DisableGateway       bool   `json:"disableGateway"`
}

// JoinRequest is what a node sends to join.
type JoinRequest struct {
	NodeName string   `json:"nodeName"`
	NodeIPs  []string `json:"nodeIPs"`
	// Password is the node's own secret, made at its first join: it keeps
	// another machine from taking over the node's name.
	Password string `json:"password"`
	// CIDRLists says the node reads the comma lists of a dual-stack
	// cluster in AgentConfig; false from a kelp that predates them.
	CIDRLists bool `json:"cidrLists,omitempty"`
}

// JoinResponse is what a node gets when it joins.
type JoinResponse struct {
	Config   AgentConfig   `json:"config"`
	ServerCA []byte        `json:"serverCA"`
	ClientCA []byte        `json:"clientCA"`
	Certs    pki.NodeCerts `json:"certs"`
}

// Routes are the join API's handlers by path.
func Routes(cfg Config) map[string]http.Handler {
	s := &joinAPI{cfg: cfg, slots: make(chan struct{}, maxJoins)}
	return map[string]http.Handler{
		CACertsPath: http.HandlerFunc(s.caCerts),
		PingPath: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintln(w, "pong")
		}),
		JoinPath:        http.HandlerFunc(s.join),
		ServerJoinPath:  http.HandlerFunc(s.serverJoin),
		WitnessJoinPath: http.HandlerFunc(s.witnessJoin),
	}
}

type joinAPI struct {
	cfg   Config
	slots chan struct{}
	limit limiter
}

func (s *joinAPI) caCerts(w http.ResponseWriter, r *http.Request) {
	ca, err := os.ReadFile(s.cfg.Certs.ServerCA.Cert)
	if err != nil {
		http.Error(w, "server CA unavailable", http.StatusInternalServerError)
		log.WithError(err).Error("read the server CA")
		return
	}
	w.Header().Set("Content-Type", "application/x-pem-file")
	_, _ = w.Write(ca)
}

func (s *joinAPI) join(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	// A node that joined renews its certificates with them, not with a
	// token: the one it joined with may have expired or been rotated since.
	node, renewal := certifiedNode(r.Context())
	var serverToken bool // the node joins with the server token
	if !renewal {
		src, id := sourceOf(r.RemoteAddr), tokenID(r.Header.Get(TokenHeader))
		if wait, ok := s.limit.retryAfter(src, id); ok {
			tooManyWrongTokens(w, wait)
			return
		}
		ok, byServerToken, err := s.authorized(r.Context(), r.Header.Get(TokenHeader))
		if err != nil {
			msg := "could not check the token"
			if errors.Is(err, errNoServerToken) {
				// The node goes on trying; the server's operator can fix this.
				msg = "the server's token file is missing or empty, so it cannot check this token; restart the server to write it again, or run `kelp token rotate` on it"
			}
			http.Error(w, msg, http.StatusServiceUnavailable)
			log.WithError(err).Error("check a join token")
			return
		}
		if !ok {
			s.limit.failed(src, id, r.RemoteAddr, "a node presented a wrong token")
			http.Error(w, "the token is not valid for this cluster: make one with `kelp token create` on a server", http.StatusUnauthorized)
			return
		}
		s.limit.succeeded(src, id)
		if serverToken = byServerToken; serverToken {
			// RFC 9111's form, which the apiserver's warnings have too.
			warning, _ := utilnet.NewWarningHeader(299, "kelp", serverTokenText)
			w.Header().Set("Warning", warning)
		}
	}
	var req JoinRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
		http.Error(w, "malformed join request: "+err.Error(), http.StatusBadRequest)
		return
	}
	ips, err := validate(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if !renewal && !req.CIDRLists && strings.Contains(s.cfg.Agent.ClusterCIDR, ",") {
		// Such a node would read one range and run half configured.
		http.Error(w, fmt.Sprintf("this cluster is dual-stack (--cluster-cidr %s), which the kelp on node %s predates: install the servers' kelp on the node and start it again", s.cfg.Agent.ClusterCIDR, req.NodeName), http.StatusConflict)
		log.WithFields(logrus.Fields{"from": r.RemoteAddr, "node": req.NodeName}).Warn("join refused: the node's kelp predates dual-stack clusters")
		return
	}
	// Before the name is claimed: a refused join leaves nothing behind.
	servers, err := s.apiserverIPs(r.Context())
	if err == nil {
		err = pki.CheckKubeletSANs(s.cfg.Certs, req.NodeName, ips, servers)
	}
	if err != nil {
		if !errors.Is(err, pki.ErrKubeletSANs) {
			http.Error(w, "could not issue the node's certificates", http.StatusInternalServerError)
			log.WithError(err).WithField("node", req.NodeName).Error("join failed")
			return
		}
		http.Error(w, err.Error(), http.StatusBadRequest)
		log.WithError(err).WithField("from", r.RemoteAddr).Warn("join refused")
		return
	}
	if renewal {
		if err := s.mayRenew(r.Context(), node, req.NodeName); err != nil {
			status := http.StatusInternalServerError
			if errors.Is(err, errRenewalRefused) {
				status = http.StatusForbidden
			}
			log.WithError(err).WithFields(logrus.Fields{"from": r.RemoteAddr, "node": node}).Warn("renewal refused")
			http.Error(w, err.Error(), status)
			return
		}
	}
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	case <-r.Context().Done():
		return
	}
	if err := s.claimName(r.Context(), req); err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, errNameTaken) {
			status = http.StatusConflict
		}
		http.Error(w, err.Error(), status)
		log.WithError(err).WithField("node", req.NodeName).Warn("join refused")
		return
	}
	resp, err := s.response(req.NodeName, ips)
	if err != nil {
		http.Error(w, "could not issue the node's certificates", http.StatusInternalServerError)
		log.WithError(err).WithField("node", req.NodeName).Error("join failed")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
	if renewal {
		log.WithFields(logrus.Fields{"node": req.NodeName, "ips": req.NodeIPs}).Info("renewed a node's certificates")
		return
	}
	if serverToken {
		log.WithFields(logrus.Fields{"node": req.NodeName, "from": r.RemoteAddr}).Warn(serverTokenText)
	}
	log.WithFields(logrus.Fields{"node": req.NodeName, "ips": req.NodeIPs}).Info("node joined")
}

// serverTokenText is what the server logs, and tells the agent, when an
// agent joins with the server token. It is let in, as agents always were,
// but the server token also joins servers, which are handed the
// cluster's CA keys: a stolen agent should not hold it.
const serverTokenText = "an agent joined with the server token, which also joins servers and hands them the cluster's CA keys: give agents a token that joins agents only, from `kelp token create` on a server (or the server's --agent-token)"

var errRenewalRefused = errors.New("renewal refused")

// mayRenew lets the node whose certificate the request came with renew
// the certificates of name: its own, while its Node exists. A node's
// certificates cannot be revoked, but `kubectl delete node` stops their
// renewal: the machine then needs a valid token to join again.
func (s *joinAPI) mayRenew(ctx context.Context, node, name string) error {
	if name != node {
		return fmt.Errorf("%w: the certificate of node %q renews only that node's certificates", errRenewalRefused, node)
	}
	_, err := s.cfg.Admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: node %q was deleted; to join again, restart kelp agent on it with a valid token", errRenewalRefused, name)
	}
	return err
}

// certifiedNode is the name of the node whose client certificate
// (system:node:<name> in system:nodes) the apiserver authenticated the
// request with, if any.
func certifiedNode(ctx context.Context) (string, bool) {
	u, ok := genericrequest.UserFrom(ctx)
	if !ok || !slices.Contains(u.GetGroups(), "system:nodes") {
		return "", false
	}
	name, ok := strings.CutPrefix(u.GetName(), "system:node:")
	return name, ok && name != ""
}

// errNoServerToken is a join whose token matched nothing while the server
// token, which it may have been, is unknown.
var errNoServerToken = errors.New("the server token file is missing or empty")

// authorized accepts the server token (serverToken says it was that one);
// as a node also the agent token and the live tokens of `kelp token
// create`, even while the server token file is missing.
func (s *joinAPI) authorized(ctx context.Context, header string) (ok, serverToken bool, err error) {
	user, secret, ok := strings.Cut(header, ":")
	if !ok || secret == "" || (user != token.ServerUser && user != token.NodeUser) {
		return false, false, nil
	}
	server, err := readSecret(s.cfg.TokenFile)
	if err != nil {
		return false, false, fmt.Errorf("the server token: %w", err)
	}
	if server != "" && token.Equal(secret, server) {
		return true, true, nil
	}
	if user == token.NodeUser {
		if ok, err := s.nodeToken(ctx, secret); ok || err != nil {
			return ok, false, err
		}
	}
	if server == "" {
		// The token may be the server's: a refusal would send the node
		// away for good, where an error lets it try again.
		return false, false, fmt.Errorf("%w: %s", errNoServerToken, s.cfg.TokenFile)
	}
	return false, false, nil
}

// nodeToken accepts the agent token and the live tokens of `kelp token
// create`.
func (s *joinAPI) nodeToken(ctx context.Context, secret string) (bool, error) {
	agent, err := readSecret(s.cfg.AgentTokenFile)
	if err != nil {
		return false, fmt.Errorf("the agent token: %w", err)
	}
	if agent != "" && token.Equal(secret, agent) {
		return true, nil
	}
	if !token.IsBootstrap(secret) {
		return false, nil
	}
	return token.VerifyBootstrap(ctx, s.cfg.Admin, secret, time.Now())
}

// readSecret reads the secret of the token in path; "" if there is none.
// An empty file has none: the server rewrites it at its next start.
func readSecret(path string) (string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) || err == nil && strings.TrimSpace(string(data)) == "" {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	t, err := token.Parse(string(data), token.NodeUser)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return t.Secret, nil
}

func validate(req JoinRequest) ([]net.IP, error) {
	if errs := validation.IsDNS1123Subdomain(req.NodeName); len(errs) > 0 {
		return nil, fmt.Errorf("node name %q: %s", req.NodeName, strings.Join(errs, "; "))
	}
	if len(req.Password) < MinPasswordLength {
		return nil, errors.New("the node password is missing or too short")
	}
	var ips []net.IP
	for _, s := range req.NodeIPs {
		ip := net.ParseIP(s)
		if ip == nil {
			return nil, fmt.Errorf("node IP %q is not an IP address", s)
		}
		ips = append(ips, ip)
	}
	return ips, nil
}

var errNameTaken = errors.New("node name taken")

// claimName records the node's password under its name, or checks it: a
// name belongs to the machine that joined under it first, until its Node
// is deleted (`kubectl delete node`), or until the operator marks its
// password Secret for a reset (passwordResetAnnotation) because that
// machine lost its password. A name whose Node exists without a password
// Secret is nobody's to take.
func (s *joinAPI) claimName(ctx context.Context, req JoinRequest) error {
	c := s.cfg.Admin
	hash := passwordHash(req.Password)
	secrets := c.CoreV1().Secrets("kube-system")
	name := passwordSecretName(req.NodeName)
	existing, err := secrets.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		exists, err := nodeExists(ctx, c, req.NodeName)
		if err != nil {
			return err
		}
		if exists {
			return fmt.Errorf("%w: node %q exists and has no node password (was its Secret %s deleted?): "+
				"if this is another machine, give it another --node-name; if the node's machine is gone or is this one, free the name with `kubectl delete node %s` (its pods are made anew)",
				errNameTaken, req.NodeName, name, req.NodeName)
		}
		_, err = secrets.Create(ctx, passwordSecret(req.NodeName, hash, false), metav1.CreateOptions{})
		return err
	case err != nil:
		return err
	case token.Equal(string(existing.Data["hash"]), hash):
		return nil
	case existing.Labels[serverNodeLabel] == "true":
		return fmt.Errorf("%w: %q is the node of a server: give this machine another --node-name", errNameTaken, req.NodeName)
	case existing.Annotations[passwordResetAnnotation] != "true":
		exists, err := nodeExists(ctx, c, req.NodeName)
		if err != nil {
			return err
		}
		if exists {
			// The same machine gets here too when it lost its password
			// file (a reinstall, a power cut): only the operator can tell.
			return fmt.Errorf("%w: node %q joined before with another node password. "+
				"If this is another machine, give it another --node-name, or free the name with `kubectl delete node %s`. "+
				"If this is that machine and it lost <data-dir>/agent/node-password, let it in, keeping its pods, with `kubectl -n kube-system annotate secret %s %s=true`",
				errNameTaken, req.NodeName, req.NodeName, name, passwordResetAnnotation)
		}
	}
	existing.Data = map[string][]byte{"hash": []byte(hash)}
	delete(existing.Annotations, passwordResetAnnotation)
	_, err = secrets.Update(ctx, existing, metav1.UpdateOptions{})
	return err
}

// passwordResetAnnotation on a node's password Secret lets the next join
// under its name set a new password: the operator's word that the machine
// of that node lost its own.
const passwordResetAnnotation = "kelp.io/node-password-reset"

func nodeExists(ctx context.Context, c kubernetes.Interface, node string) (bool, error) {
	_, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// serverNodeLabel marks the password Secret of a server's own node.
const serverNodeLabel = "kelp.io/server-node"

func passwordSecretName(node string) string { return node + ".node-password.kelp" }

func passwordHash(password string) string {
	sum := sha256.Sum256([]byte(password))
	return hex.EncodeToString(sum[:])
}

func passwordSecret(node, hash string, server bool) *corev1.Secret {
	labels := map[string]string{"kelp.io/node-password": node}
	if server {
		labels[serverNodeLabel] = "true"
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: passwordSecretName(node), Namespace: "kube-system", Labels: labels},
		Data:       map[string][]byte{"hash": []byte(hash)},
	}
}

// ClaimServerNode takes node, a server's own node, for the server: its
// password Secret holds the hash of a password nobody has, so no machine
// joins under its name. Servers do not join through the join API; without
// it, an agent token could claim a server's node name, and with it
// system:node:<server> and the Secrets of the server's pods. One that an
// agent claimed is taken back, with a warning.
func ClaimServerNode(ctx context.Context, c kubernetes.Interface, node string) error {
	secrets := c.CoreV1().Secrets("kube-system")
	existing, err := secrets.Get(ctx, passwordSecretName(node), metav1.GetOptions{})
	if err == nil && existing.Labels[serverNodeLabel] == "true" {
		return nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("read the node password of this server's node %s: %w", node, err)
	}
	password, rerr := token.Random()
	if rerr != nil {
		return rerr
	}
	claim := passwordSecret(node, passwordHash(password), true)
	if apierrors.IsNotFound(err) {
		_, err = secrets.Create(ctx, claim, metav1.CreateOptions{})
	} else {
		log.Errorf("a machine joined as an agent under the server node name %s (its address: `kubectl get node %[1]s -o wide`, before this server's node takes the name over): "+
			"the name is the server's again and that machine can no longer join or renew under it, but the certificates it was issued stay valid until they expire; "+
			"revoke them by rotating the CAs (`kelp certificate rotate-ca`, then `--finish`: README, Rotating the CAs)", node)
		existing.Labels, existing.Data = claim.Labels, claim.Data
		_, err = secrets.Update(ctx, existing, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("claim the node name %s for this server: %w", node, err)
	}
	return nil
}

// apiserverIPs are the addresses of every apiserver of the cluster, as
// the kubernetes Service's EndpointSlices list them: no node's serving
// certificate may name one, also where the servers share a CA for
// kubelets and apiservers (pki.Config.SharedDatastore).
func (s *joinAPI) apiserverIPs(ctx context.Context) ([]net.IP, error) {
	slices, err := s.cfg.Admin.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=kubernetes"})
	if err != nil {
		return nil, fmt.Errorf("list the apiservers' addresses: %w", err)
	}
	var ips []net.IP
	for _, slice := range slices.Items {
		for _, e := range slice.Endpoints {
			for _, a := range e.Addresses {
				if ip := net.ParseIP(a); ip != nil {
					ips = append(ips, ip)
				}
			}
		}
	}
	return ips, nil
}

func (s *joinAPI) response(name string, ips []net.IP) (JoinResponse, error) {
	certs, err := pki.IssueNode(s.cfg.Certs, name, ips)
	if err != nil {
		return JoinResponse{}, err
	}
	serverCA, err := os.ReadFile(s.cfg.Certs.ServerCA.Cert)
	if err != nil {
		return JoinResponse{}, err
	}
	clientCA, err := os.ReadFile(s.cfg.Certs.ClientCA.Cert)
	if err != nil {
		return JoinResponse{}, err
	}
	return JoinResponse{Config: s.cfg.Agent, ServerCA: serverCA, ClientCA: clientCA, Certs: certs}, nil
}

// ServerNodes are the names of the nodes that servers run, as they
// claimed them (ClaimServerNode); the others are agents'.
func ServerNodes(ctx context.Context, c kubernetes.Interface) (map[string]bool, error) {
	list, err := c.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{LabelSelector: serverNodeLabel + "=true"})
	if err != nil {
		return nil, fmt.Errorf("list the servers' node passwords: %w", err)
	}
	servers := map[string]bool{}
	for _, s := range list.Items {
		if node := s.Labels["kelp.io/node-password"]; node != "" {
			servers[node] = true
		}
	}
	return servers, nil
}
