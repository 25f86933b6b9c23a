package config

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

func runWitness(t *testing.T, args ...string) (Witness, error) {
	t.Helper()
	t.Setenv(configFileEnv, writeFile(t, filepath.Join(t.TempDir(), "empty.yaml"), ""))
	var in WitnessInput
	var got Witness
	app := &cli.App{
		Name: "kelp",
		Commands: []*cli.Command{{
			Name:  "witness",
			Flags: WitnessFlags(&in),
			Action: func(*cli.Context) error {
				w, err := in.Parse(testHost)
				got = w
				return err
			},
		}},
	}
	full, err := WithFileArgs(app, append([]string{"kelp", "witness"}, args...))
	if err != nil {
		return Witness{}, err
	}
	return got, app.Run(full)
}

func TestWitness(t *testing.T) {
	tokenFile := writeFile(t, filepath.Join(t.TempDir(), "token"), "K10abc::server:s3cret\n")
	w, err := runWitness(t, "--server", "https://10.99.0.2:6443/", "--token-file", tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	if w.Server != "https://10.99.0.2:6443" || w.Token != "K10abc::server:s3cret" || w.Name != "node1" || w.DataDir != "/var/lib/kelp" || w.IP.String() != "192.168.1.10" {
		t.Errorf("parsed %+v", w)
	}
	// A witness that joined starts without the token.
	w, err = runWitness(t, "--server", "https://10.99.0.2:6443", "--node-name", "pi", "--node-ip", "10.0.0.7", "--data-dir", "/srv/kelp")
	if err != nil || w.Token != "" || w.Name != "pi" || w.IP.String() != "10.0.0.7" || w.DataDir != "/srv/kelp" {
		t.Errorf("without a token: %+v, %v", w, err)
	}
}

func TestWitnessBadInput(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-token")
	empty := writeFile(t, filepath.Join(t.TempDir(), "empty-token"), "\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--server is required: the URL of a server of the cluster, https://<server>:6443"},
		{[]string{"--server", "http://10.99.0.2:6443"}, `--server "http://10.99.0.2:6443": want https://<server>:6443`},
		{[]string{"--server", "10.99.0.2:6443"}, "want https://<server>:6443"},
		{[]string{"--server", "https://10.99.0.2:6443/v1"}, "want https://<server>:6443"},
		{[]string{"--server", "https://10.99.0.2:6443", "--token-file", missing}, "--token-file: open " + missing},
		{[]string{"--server", "https://10.99.0.2:6443", "--token-file", missing}, "put the server token in it, from <data-dir>/server/token on a server"},
		{[]string{"--server", "https://10.99.0.2:6443", "--token-file", empty}, "is empty"},
		{[]string{"--server", "https://10.99.0.2:6443", "--node-ip", "pi.local"}, `--node-ip "pi.local": not an IP address`},
		{[]string{"--server", "https://10.99.0.2:6443", "--node-ip", "0.0.0.0"}, "want an address of this machine"},
		{[]string{"--server", "https://10.99.0.2:6443", "--node-name", "Pi_Zero"}, "is not a valid node name"},
		{[]string{"--server", "https://10.99.0.2:6443", "--data-dir", "kelp"}, "want an absolute path"},
		{[]string{"--server", "https://10.99.0.2:6443", "--token", "x"}, "flag provided but not defined: -token"},
	} {
		_, err := runWitness(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}
