package procstat

import (
	"os"
	"testing"
)

func TestParse(t *testing.T) {
	s, err := Parse([]byte("4242 (a (b) c) S 17 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615\n"))
	if err != nil || s != (Stat{Comm: "a (b) c", State: "S", PPid: 17, StartTime: 987654}) || !s.Alive() {
		t.Fatalf("got %+v, %v", s, err)
	}
	if z, _ := Parse([]byte("1 (x) Z 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0 0\n")); z.Alive() {
		t.Error("a zombie is alive")
	}
	for _, bad := range []string{"", "1 x S 1", "1 (x) S 1 2"} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	self, err := Read(os.Getpid())
	if err != nil || self.PPid != os.Getppid() || !self.Alive() {
		t.Errorf("this process: %+v %v", self, err)
	}
}
