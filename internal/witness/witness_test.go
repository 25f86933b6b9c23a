package witness

import (
	"bytes"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/kelp-dev/kelp/internal/config"
)

// A witness that has not joined needs the server token, and says where to
// find it; a token that joins agents only is refused before it is sent.
func TestJoinToken(t *testing.T) {
	for _, tc := range []struct {
		what, token, want string
	}{
		{"no token", "", "this witness has not joined its cluster yet"},
		{"no token", "", "give --token-file FILE, FILE holding the server token from <data-dir>/server/token on a server"},
		{"an agent token", "KELP1" + strings.Repeat("a", 64) + "::node:agent-secret", "joins agents only"},
		{"a token of kelp token create", "abcdef.0123456789abcdef", "joins agents only"},
		{"a mangled token", "KELP1abc::server:x", "--token-file"},
	} {
		_, err := joinToken(config.Witness{DataDir: "/var/lib/kelp", Token: tc.token})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.what, err, tc.want)
		}
	}
	tok, err := joinToken(config.Witness{Token: "KELP1" + strings.Repeat("a", 64) + "::server:s3cret"})
	if err != nil || tok.Secret != "s3cret" {
		t.Errorf("the server token: %+v, %v", tok, err)
	}
}

// The witness logs its promotion and the leader it follows, and nothing
// while they stay the same.
func TestLogChange(t *testing.T) {
	logger, hook := test.NewNullLogger()
	log := logrus.NewEntry(logger)
	members := []Member{{Name: "server-1", Leader: true}, {Name: "server-2"}, {Name: "witness/pi", Self: true}}
	learner := State{Member: "witness/pi", Learner: true}
	voter := State{Member: "witness/pi", Leader: "server-1", Members: members}
	leaderless := State{Member: "witness/pi", Members: members}
	newLeader := State{Member: "witness/pi", Leader: "server-2", Members: members}
	for _, step := range []struct {
		before, now State
		first       bool
		want        string
	}{
		{State{}, learner, true, "The witness is a learner"},
		{learner, learner, false, ""},
		{learner, voter, false, "The witness is a voting member"},
		{voter, voter, false, ""},
		{voter, leaderless, false, "sees no etcd leader"},
		{leaderless, leaderless, false, ""},
		{leaderless, newLeader, false, "follows the etcd leader server-2"},
	} {
		hook.Reset()
		logChange(log, step.before, step.now, step.first)
		got := ""
		if e := hook.LastEntry(); e != nil {
			got = e.Message
		}
		if (step.want == "") != (got == "") || !strings.Contains(got, step.want) {
			t.Errorf("%+v → %+v: logged %q, want %q", step.before, step.now, got, step.want)
		}
	}
	if voters := voter.Voters(); voters != 3 {
		t.Errorf("Voters = %d, want 3", voters)
	}
}

func TestPrint(t *testing.T) {
	var out bytes.Buffer
	s := State{Member: "witness/pi", Leader: "server-1", Term: 4, Members: []Member{
		{Name: "server-1", PeerURL: "https://10.0.0.2:2380", Leader: true},
		{Name: "witness/pi", PeerURL: "https://10.0.0.9:2380", Self: true},
	}}
	if err := Print(&out, s); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"witness witness/pi: voting member; etcd leader: server-1 (term 4); 2 voting members", "(leader)", "(this witness)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
