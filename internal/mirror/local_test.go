package mirror

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
)

// TestOwnUser: the local face answers only the processes of the user kelp
// runs as, containerd's; here that of the test.
func TestOwnUser(t *testing.T) {
	served := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "served") })
	self := uint32(os.Getuid())
	for _, tt := range []struct {
		name   string
		uid    uint32
		status int
	}{
		{"a process of kelp's user", self, http.StatusOK},
		{"a process of another user", self + 1, http.StatusForbidden},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(ownUser{uid: tt.uid, next: served})
			defer srv.Close()
			resp, err := http.Get(srv.URL + "/v2/")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.status || (tt.status == http.StatusOK) != strings.Contains(string(body), "served") {
				t.Errorf("%s %q", resp.Status, body)
			}
		})
	}
}
