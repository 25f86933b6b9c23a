package fleet

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kelp-dev/kelp/internal/layout"
)

// A URL that serves more than spec.maxSize is cut off there, with or
// without a Content-Length, and nothing is left behind.
func TestFetchMaxSize(t *testing.T) {
	big := newKelp + "# " + strings.Repeat("x", 4096) + "\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/chunked" {
			w.(http.Flusher).Flush() // no Content-Length
		}
		fmt.Fprint(w, big)
	}))
	defer srv.Close()
	for _, path := range []string{"/sized", "/chunked"} {
		dir := t.TempDir()
		_, err := fetch(context.Background(), valid(t, Spec{SHA256: sum(big), URL: srv.URL + path, AllowHTTP: true, MaxSize: "1Ki"}), dir, dir)
		if err == nil || !strings.Contains(err.Error(), "more than spec.maxSize 1Ki") {
			t.Errorf("%s: %v, want an error about spec.maxSize", path, err)
		}
		if left := leftovers(t, dir); len(left) > 0 {
			t.Errorf("%s: left behind: %v", path, left)
		}
	}
	dir := t.TempDir()
	if _, err := fetch(context.Background(), valid(t, Spec{SHA256: sum(big), URL: srv.URL + "/sized", AllowHTTP: true, MaxSize: "8Ki"}), dir, dir); err != nil {
		t.Errorf("within spec.maxSize: %v", err)
	}
}

// A redirect from https to http is refused; one to https is followed.
func TestDownloadRefusesDowngrade(t *testing.T) {
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "plain") }))
	defer plain.Close()
	secure := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/down":
			http.Redirect(w, r, plain.URL+"/kelp", http.StatusFound)
		case "/up":
			http.Redirect(w, r, "/kelp", http.StatusFound)
		default:
			fmt.Fprint(w, "secure")
		}
	}))
	defer secure.Close()
	client := downloadClient(secure.Client().Transport)
	if resp, err := client.Get(secure.URL + "/down"); err == nil || !strings.Contains(err.Error(), "refused: a redirect from https to http") {
		if err == nil {
			resp.Body.Close()
		}
		t.Errorf("https → http: %v, want it refused", err)
	}
	resp, err := client.Get(secure.URL + "/up")
	if err != nil {
		t.Fatalf("https → https: %v", err)
	}
	resp.Body.Close()
}

// The server checks the new kelp in a file beside the running kelp,
// where each node puts it too, never in its data dir, whose disk the
// datastore may have to itself.
func TestControllerStagesBesideKelp(t *testing.T) {
	record := filepath.Join(t.TempDir(), "ran-as")
	script := "#!/bin/sh\necho \"$0\" >" + record + "\nprintf 'kelp v9.9.9 (test)\\nkubernetes v1.36.3\\n'\n"
	c, get := testController(t, newUpgrade("up", 0, Spec{SHA256: sum(script), Path: "kelp-new"}))
	upgrades := layout.Agent(c.cfg.DataDir).Upgrades
	mkdir(t, upgrades)
	write(t, filepath.Join(upgrades, "kelp-new"), script)
	if err := c.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if u := get("up"); u.Status.Phase != PhaseUpgrading {
		_, msg := readyMessage(u)
		t.Fatalf("the Upgrade is %s (%s), want Upgrading", u.Status.Phase, msg)
	}
	ran, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	if dir := filepath.Dir(strings.TrimSpace(string(ran))); dir != c.cfg.StageDir {
		t.Errorf("the new kelp was checked in %s, want %s (beside the running kelp, not in the data dir %s)", dir, c.cfg.StageDir, c.cfg.DataDir)
	}
	if left := leftovers(t, c.cfg.StageDir); len(left) > 0 {
		t.Errorf("left beside kelp: %v", left)
	}
}
