package config

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/token"
)

// Witness is the validated configuration of `kelp witness`: a voting
// member of a cluster's embedded etcd and nothing else.
type Witness struct {
	Server string // https URL of a server, joined through once
	// Token is the server token from --token-file; empty when none was
	// given, which only a witness that has joined may start with.
	Token   string
	DataDir string
	Name    string     // --node-name; its etcd member is witness/<Name>
	IP      netip.Addr // where the other members reach it
	Debug   bool
}

// WitnessInput holds the raw flag values of `kelp witness` until Parse
// validates them. Its zero value is ready for WitnessFlags.
type WitnessInput struct {
	server, tokenFile, dataDir, name, ip string
	debug                                bool
}

// WitnessFlags returns the flags of `kelp witness`, bound to in. The token
// comes from a file only: a secret on a command line is every local
// user's to read.
func WitnessFlags(in *WitnessInput) []cli.Flag {
	dataDir := DataDirFlag()
	dataDir.Destination = &in.dataDir
	return []cli.Flag{
		ConfigFlag(),
		&cli.BoolFlag{Name: "debug", Aliases: []string{"v"}, EnvVars: env("debug"), Destination: &in.debug, Usage: "log at debug level"},
		dataDir,
		&cli.StringFlag{Name: "server", Aliases: []string{"s"}, EnvVars: []string{"KELP_URL"}, Destination: &in.server, Usage: "server to join through, https://<server>:6443; once joined, the witness starts without it"},
		&cli.StringFlag{Name: "token-file", EnvVars: env("token-file"), Destination: &in.tokenFile, Usage: "file holding the server token (<data-dir>/server/token on a server), needed for the first start only"},
		&cli.StringFlag{Name: "node-name", EnvVars: env("node-name"), Destination: &in.name, Usage: "name of the witness; its etcd member is witness/<name> (default: the hostname)"},
		&cli.StringFlag{Name: "node-ip", EnvVars: env("node-ip"), Destination: &in.ip, Usage: "IP address the servers reach this witness's etcd at, port 2380 (default: detected from the default route)"},
	}
}

// Parse validates the flag values into a Witness.
func (in *WitnessInput) Parse(host Host) (Witness, error) {
	var errs []error
	check := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	w := Witness{Server: strings.TrimRight(in.server, "/"), DataDir: filepath.Clean(in.dataDir), Debug: in.debug}
	if !filepath.IsAbs(in.dataDir) {
		check(fmt.Errorf("--data-dir %q: want an absolute path", in.dataDir))
	}
	u, err := url.Parse(w.Server)
	switch {
	case in.server == "":
		check(errors.New("--server is required: the URL of a server of the cluster, https://<server>:6443"))
	case err != nil || u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/"):
		check(fmt.Errorf("--server %q: want https://<server>:6443", in.server))
	}
	if in.tokenFile != "" {
		tok, err := token.ReadFile("--token-file", in.tokenFile)
		if err != nil {
			err = fmt.Errorf("%w: put the server token in it, from <data-dir>/server/token on a server", err)
		}
		check(err)
		w.Token = tok
	}
	w.Name, err = nodeName(in.name, host.Hostname)
	check(err)
	switch {
	case in.ip != "":
		w.IP, err = parseIP("--node-ip", in.ip)
		check(err)
	case host.IP.IsValid():
		w.IP = host.IP
	default:
		check(errors.New("no address found for the witness: set --node-ip"))
	}
	if w.IP.IsValid() && (w.IP.IsUnspecified() || w.IP.IsMulticast()) {
		check(fmt.Errorf("--node-ip %s: want an address of this machine that the servers reach", w.IP))
	}
	if len(errs) > 0 {
		return Witness{}, errors.Join(errs...)
	}
	return w, nil
}
