package datastore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/membership"
)

// Errors a joining server can be refused with.
var (
	// ErrMemberTaken is a join under a name or peer address that a
	// started member already has.
	ErrMemberTaken = errors.New("already a member")
	// ErrJoinInProgress is a join while another added member is still a
	// learner: etcd adds one learner at a time.
	ErrJoinInProgress = errors.New("another server is joining")
)

// witnessPrefix starts the etcd member name of a witness (`kelp
// witness`): a "/" is in no Node's name, so no Node's deletion removes a
// witness (package etcdmembers), and `kelp etcdctl member list` shows it
// for what it is.
const witnessPrefix = "witness/"

// WitnessMember is the etcd member name of the witness named name.
func WitnessMember(name string) string { return witnessPrefix + name }

// IsWitnessMember says whether the etcd member named member is a witness.
func IsWitnessMember(member string) bool { return strings.HasPrefix(member, witnessPrefix) }

// learnerCheckInterval is how often a voting member looks for learners to
// promote: a MemberList answered locally, cheap enough for an idle server.
const learnerCheckInterval = 10 * time.Second

// Members changes the membership of the embedded etcd cluster through this
// server's member. Each call opens its own client: joins and removals are rare.
type Members struct {
	be    Backend
	joins *sync.Mutex
}

// Members returns the membership of the embedded etcd cluster, or nil when
// the datastore is not embedded etcd.
func (d *Datastore) Members() *Members {
	if d.backend.Kind != KindEtcd {
		return nil
	}
	return &Members{be: d.Backend(), joins: &d.joins}
}

func (m *Members) client() (*clientv3.Client, error) {
	cli, err := newClient(m.be)
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	return cli, nil
}

// AddLearner adds a server named name, reached by peers at peerURL, as a
// learner, and returns the --initial-cluster it must start with. A server
// that was added but never started (it failed before its etcd ran) gets
// its place back.
func (m *Members) AddLearner(ctx context.Context, name, peerURL string) (initialCluster string, err error) {
	m.joins.Lock()
	defer m.joins.Unlock()
	cli, err := m.client()
	if err != nil {
		return "", err
	}
	defer cli.Close()
	list, err := cli.MemberList(ctx)
	if err != nil {
		return "", fmt.Errorf("list etcd members: %w", err)
	}
	switch id, err := placeFor(list.Members, name, peerURL); {
	case err != nil:
		return "", err
	case id != 0:
		return initialClusterOf(list.Members, id, name), nil
	}
	added, err := cli.MemberAddAsLearner(ctx, []string{peerURL})
	if err != nil {
		return "", fmt.Errorf("add etcd learner %s: %w", peerURL, err)
	}
	return initialClusterOf(added.Members, added.Member.ID, name), nil
}

// placeFor says whether the server named name at peerURL may be added to
// members: the id of its own unstarted member to start as, 0 to add it, or
// why not. etcd takes one learner at a time and checks that only when it
// applies the addition: a refused addition stays in its log, and a member
// that replays it after a restart dials the refused id at the peer address
// for as long as it runs. So another learner, started or not, makes the
// server wait until it has been promoted.
func placeFor(members []*pb.Member, name, peerURL string) (uint64, error) {
	for _, mem := range members {
		ownURL := slices.Contains(mem.PeerURLs, peerURL)
		switch {
		case ownURL && mem.Name == "":
			return mem.ID, nil
		case ownURL:
			return 0, fmt.Errorf("%w: the peer address %s is server %q's", ErrMemberTaken, peerURL, mem.Name)
		case mem.Name == name:
			return 0, fmt.Errorf("%w: a server named %q is", ErrMemberTaken, name)
		}
	}
	for _, mem := range members {
		switch {
		case mem.Name == "":
			return 0, fmt.Errorf("%w (peer address %s)", ErrJoinInProgress, strings.Join(mem.PeerURLs, ","))
		case mem.IsLearner:
			return 0, fmt.Errorf("%w (server %q is not promoted yet; if it never comes back, remove it with `kelp etcdctl member remove %x` on a server)", ErrJoinInProgress, mem.Name, mem.ID)
		}
	}
	return 0, nil
}

// initialClusterOf spells the members as etcd's --initial-cluster, naming
// the not yet started member id.
func initialClusterOf(members []*pb.Member, id uint64, name string) string {
	var parts []string
	for _, mem := range members {
		n := mem.Name
		if mem.ID == id {
			n = name
		}
		for _, u := range mem.PeerURLs {
			parts = append(parts, n+"="+u)
		}
	}
	return strings.Join(parts, ",")
}

// Remove removes the member named name, if there is one, and says whether
// there was. It never removes a witness, which has no Node: an operator
// retires one with `kelp etcdctl member remove`.
func (m *Members) Remove(ctx context.Context, name string) (bool, error) {
	if IsWitnessMember(name) {
		return false, nil
	}
	cli, err := m.client()
	if err != nil {
		return false, err
	}
	defer cli.Close()
	list, err := cli.MemberList(ctx)
	if err != nil {
		return false, fmt.Errorf("list etcd members: %w", err)
	}
	for _, mem := range list.Members {
		if mem.Name != name {
			continue
		}
		for {
			_, err := cli.MemberRemove(ctx, mem.ID)
			switch {
			case err == nil:
				return true, nil
			case errors.Is(err, rpctypes.ErrMemberNotFound):
				return false, nil
			case !errors.Is(err, rpctypes.ErrUnhealthy):
				return false, fmt.Errorf("remove etcd member %s: %w", name, err)
			}
			// etcd refuses a removal that would leave fewer members
			// active than a quorum, counting one that joined in the
			// last seconds as not active yet.
			select {
			case <-ctx.Done():
				return false, fmt.Errorf("remove etcd member %s: %w: the remaining members would not be a healthy quorum", name, err)
			case <-time.After(time.Second):
			}
		}
	}
	return false, nil
}

// peerURLRetry is how long a member waits to ask again for its peer URLs
// to be updated when the cluster could not do it.
const peerURLRetry = 5 * time.Second

// updatePeerURLs makes the cluster's record of this member's peer URLs the
// ones it advertises now, once it has joined the cluster. etcd records
// the URLs a member was added with and never changes them itself: a server
// that starts at another address than it had (a new DHCP lease, a moved
// machine) would be dialed by the other members at the old one, and
// listed there. The moved member reaches the others at their recorded
// URLs, so its proposal goes through them to the cluster.
func updatePeerURLs(ctx context.Context, e *embed.Etcd, log *logrus.Entry) {
	select {
	case <-ctx.Done():
		return
	case <-e.Server.ReadyNotify():
	}
	id := e.Server.MemberID()
	var want []string
	for _, u := range e.Config().AdvertisePeerUrls {
		want = append(want, u.String())
	}
	for {
		self := e.Server.Cluster().Member(id)
		if self == nil || slices.Equal(sorted(self.PeerURLs), sorted(want)) {
			return
		}
		_, err := e.Server.UpdateMember(ctx, membership.Member{ID: id, RaftAttributes: membership.RaftAttributes{PeerURLs: want}})
		fields := logrus.Fields{"member": self.Name, "was": strings.Join(self.PeerURLs, ","), "now": strings.Join(want, ",")}
		if err == nil {
			log.WithFields(fields).Info("Updated this server's etcd peer URL to its new address")
			return
		}
		log.WithError(err).WithFields(fields).Warnf("could not update this server's etcd peer URL to its new address; trying again in %s", peerURLRetry)
		select {
		case <-ctx.Done():
			return
		case <-time.After(peerURLRetry):
		}
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// promoteLearners makes learners voting members once they have caught up,
// until ctx ends. Every voting member runs it; a learner cannot list
// members, so it does nothing until it is promoted itself.
func promoteLearners(ctx context.Context, be Backend, log *logrus.Entry) {
	cli, err := newClient(be)
	if err != nil {
		log.WithError(err).Warn("no etcd client: learners joining through this server wait for another to promote them")
		return
	}
	defer cli.Close()
	wait := learnerCheckInterval / 5
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = learnerCheckInterval
		if promote(ctx, cli, log) {
			// A learner that started catches up in seconds: look again soon.
			wait = learnerCheckInterval / 5
		}
	}
}

// promote promotes the learners that have caught up and says whether any
// is still waiting.
func promote(ctx context.Context, cli *clientv3.Client, log *logrus.Entry) (waiting bool) {
	ctx, cancel := context.WithTimeout(ctx, probeAttemptTimeout)
	defer cancel()
	list, err := cli.MemberList(ctx, clientv3.WithSerializable())
	if err != nil {
		return false
	}
	for _, mem := range list.Members {
		if !mem.IsLearner {
			continue
		}
		// A learner that has not published its name yet may have caught
		// up already; etcd refuses one that has not.
		_, err := cli.MemberPromote(ctx, mem.ID)
		switch {
		case err == nil:
			log.WithFields(logrus.Fields{"member": mem.Name, "id": fmt.Sprintf("%x", mem.ID)}).Info("Promoted etcd learner to voting member")
		case errors.Is(err, rpctypes.ErrMemberLearnerNotReady):
			waiting = true
		default:
			log.WithError(err).WithField("member", mem.Name).Debug("promote etcd learner")
		}
	}
	return waiting
}
