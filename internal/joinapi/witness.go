package joinapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/pki"
)

// WitnessJoinPath is where an etcd witness (`kelp witness`) joins the
// embedded etcd cluster.
const WitnessJoinPath = "/v1-kelp/witness-join"

// WitnessJoinRequest is what a witness sends to join.
type WitnessJoinRequest struct {
	// Name is the witness's; its etcd member is datastore.WitnessMember(Name).
	Name string `json:"name"`
	// PeerURL is where the other members reach it, https://<ip>:<port>.
	PeerURL string `json:"peerURL"`
}

// WitnessJoinResponse is what a witness gets: its place in the membership
// and its etcd certificates, nothing of the control plane.
type WitnessJoinResponse struct {
	// InitialCluster is the etcd membership it starts with, itself included.
	InitialCluster string           `json:"initialCluster"`
	Certs          pki.WitnessCerts `json:"certs"`
}

// witnessJoin adds a witness as an etcd learner, which the servers promote
// once it has caught up. It takes the server token only: a voting member
// holds every object of the cluster and can rewrite any, as a server can.
// It gets what serving etcd takes and no more: no CA key, no client
// certificate of the apiserver's, no Secrets encryption keys, no tokens.
func (s *joinAPI) witnessJoin(w http.ResponseWriter, r *http.Request) {
	if !s.serverTokenPost(w, r, "witness", "a witness joins with the server token (<data-dir>/server/token on a server): it is a voting member of the cluster's etcd") {
		return
	}
	var req WitnessJoinRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
		http.Error(w, "malformed join request: "+err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := s.admitWitness(r, req)
	if err != nil {
		status := http.StatusConflict
		if errors.Is(err, errUnavailable) {
			status = http.StatusServiceUnavailable
		}
		log.WithError(err).WithField("witness", req.Name).Warn("witness join refused")
		http.Error(w, err.Error(), status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
	log.WithFields(logrus.Fields{"witness": req.Name, "peer": req.PeerURL, "from": r.RemoteAddr}).Info("etcd witness joined: it votes once it has caught up")
}

func (s *joinAPI) admitWitness(r *http.Request, req WitnessJoinRequest) (WitnessJoinResponse, error) {
	if errs := validation.IsDNS1123Subdomain(req.Name); len(errs) > 0 {
		return WitnessJoinResponse{}, fmt.Errorf("witness name %q: %s", req.Name, strings.Join(errs, "; "))
	}
	if s.cfg.Members == nil {
		return WitnessJoinResponse{}, fmt.Errorf("this cluster keeps its state in %s, not in embedded etcd: a witness is a member of embedded etcd; "+
			"start the cluster's first server with --cluster-init (it moves a SQLite cluster to etcd) and join a second with --server", s.cfg.Datastore)
	}
	u, err := url.Parse(req.PeerURL)
	var ip net.IP
	if err == nil {
		ip = net.ParseIP(u.Hostname())
	}
	if err != nil || u.Scheme != "https" || u.Port() == "" || ip == nil {
		return WitnessJoinResponse{}, fmt.Errorf("the witness's etcd peer URL %q is not https://<ip>:<port>", req.PeerURL)
	}
	certs, err := pki.IssueWitness(s.cfg.Certs, req.Name, ip)
	if err != nil {
		log.WithError(err).WithField("witness", req.Name).Error("issue a witness's certificates")
		return WitnessJoinResponse{}, fmt.Errorf("%w: could not issue the witness's certificates", errUnavailable)
	}
	initial, err := s.cfg.Members.AddLearner(r.Context(), datastore.WitnessMember(req.Name), req.PeerURL)
	if err != nil {
		if errors.Is(err, datastore.ErrMemberTaken) {
			return WitnessJoinResponse{}, fmt.Errorf("%w: give this witness another --node-name, or, if it replaces that witness, remove the old one first with `kelp etcdctl member remove <id>` on a server", err)
		}
		return WitnessJoinResponse{}, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	return WitnessJoinResponse{InitialCluster: initial, Certs: certs}, nil
}
