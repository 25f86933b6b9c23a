package witness

import (
	"context"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/datastore"
)

const (
	// observeInterval is how often the witness looks at its member: a
	// Status and a MemberList answered locally.
	observeInterval = 5 * time.Second
	requestTimeout  = 5 * time.Second
)

// State is what the witness's member says of itself and its cluster.
type State struct {
	Member  string // its own member's name
	Learner bool   // not promoted yet
	Leader  string // the leader's name; "" while there is none
	Term    uint64
	Members []Member
}

// Member is one member of the cluster as the witness sees it.
type Member struct {
	Name, PeerURL string
	Learner       bool
	Leader, Self  bool
}

// Voters counts the voting members.
func (s State) Voters() int {
	n := 0
	for _, m := range s.Members {
		if !m.Learner {
			n++
		}
	}
	return n
}

// readState asks the witness's own member, at endpoint, without needing
// a quorum.
func readState(ctx context.Context, cli *clientv3.Client, endpoint string) (State, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	st, err := cli.Status(ctx, endpoint)
	if err != nil {
		return State{}, err
	}
	s := State{Learner: st.IsLearner, Term: st.RaftTerm}
	// A learner may not list the members; its Status says enough.
	list, err := cli.MemberList(ctx, clientv3.WithSerializable())
	if err != nil {
		return s, nil
	}
	for _, m := range list.Members {
		mem := Member{Name: m.Name, Learner: m.IsLearner, Leader: m.ID == st.Leader, Self: m.ID == st.Header.MemberId}
		if len(m.PeerURLs) > 0 {
			mem.PeerURL = m.PeerURLs[0]
		}
		if mem.Leader {
			s.Leader = m.Name
		}
		if mem.Self {
			s.Member = m.Name
		}
		s.Members = append(s.Members, mem)
	}
	slices.SortFunc(s.Members, func(a, b Member) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return s, nil
}

// observe logs what changes in the witness's standing until ctx ends: its
// promotion, and the leader it follows or the lack of one. A steady
// cluster logs nothing.
func observe(ctx context.Context, be datastore.Backend, log *logrus.Entry) {
	cli, err := datastore.NewClient(be)
	if err != nil {
		log.WithError(err).Warn("no etcd client: the witness does not log its standing")
		return
	}
	defer cli.Close()
	var last State
	first := true
	for {
		s, err := readState(ctx, cli, be.Endpoints[0])
		if err == nil {
			logChange(log, last, s, first)
			last, first = s, false
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(observeInterval):
		}
	}
}

// logChange logs the difference between the witness's standing before and
// now; first logs where it stands at its start.
func logChange(log *logrus.Entry, before, now State, first bool) {
	fields := logrus.Fields{"voters": now.Voters(), "leader": now.Leader, "term": now.Term}
	switch {
	case now.Learner:
		if first {
			log.Info("The witness is a learner: it votes once a server has promoted it")
		}
	case first || before.Learner:
		log.WithFields(fields).Info("The witness is a voting member of the cluster's etcd")
	case now.Leader == "" && before.Leader != "":
		log.WithFields(fields).Warn("The witness sees no etcd leader: fewer than a majority of the members reach each other")
	case now.Leader != "" && now.Leader != before.Leader:
		log.WithFields(fields).Info("The witness follows the etcd leader " + now.Leader)
	}
}

// Print writes s for an operator.
func Print(w io.Writer, s State) error {
	role := "voting member"
	if s.Learner {
		role = "learner, not promoted yet"
	}
	leader := s.Leader
	if leader == "" {
		leader = "none (no majority of the members reach each other)"
	}
	fmt.Fprintf(w, "witness %s: %s; etcd leader: %s (term %d); %d voting members\n", s.Member, role, leader, s.Term, s.Voters())
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tROLE\tPEER URL\t")
	for _, m := range s.Members {
		role := "voter"
		if m.Learner {
			role = "learner"
		}
		var notes []string
		if m.Leader {
			notes = append(notes, "leader")
		}
		if m.Self {
			notes = append(notes, "this witness")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.Name, role, m.PeerURL, joinNotes(notes))
	}
	return tw.Flush()
}

func joinNotes(notes []string) string {
	if len(notes) == 0 {
		return ""
	}
	out := "(" + notes[0]
	for _, n := range notes[1:] {
		out += ", " + n
	}
	return out + ")"
}

// StatusCommand is `kelp witness status`.
func StatusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "show this witness's etcd member: voter or learner, the leader, and the members it sees",
		Flags: config.NodeFlags(),
		Action: func(c *cli.Context) error {
			dataDir, err := config.DataDir(c)
			if err != nil {
				return err
			}
			return status(c.Context, c.App.Writer, dataDir)
		},
	}
}

func status(ctx context.Context, w io.Writer, dataDir string) error {
	if !datastore.IsWitness(dataDir) {
		return fmt.Errorf("%s holds no witness (no etcd member in %s): start one with `kelp witness --server https://<server>:6443 --token-file FILE`, or give its --data-dir", dataDir, datastore.WitnessEtcdDir(dataDir))
	}
	be := datastore.WitnessBackend(dataDir)
	cli, err := datastore.NewClient(be)
	if err != nil {
		return err
	}
	defer cli.Close()
	s, err := readState(ctx, cli, be.Endpoints[0])
	if err != nil {
		return fmt.Errorf("the witness's etcd at %s does not answer (%w): is `kelp witness --data-dir %s` running?", be.Endpoints[0], err, dataDir)
	}
	return Print(w, s)
}
