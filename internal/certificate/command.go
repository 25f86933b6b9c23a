// Package certificate is `kelp certificate`: how long a server's and a
// node's certificates have left, and new leaf certificates on demand.
package certificate

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
)

// Exit statuses of `kelp certificate check`, for scripts.
const (
	exitExpired = 1
	exitWarn    = 2
)

// Command is `kelp certificate`.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "certificate",
		Usage: "check how long this machine's certificates have left, and rotate a server's leaf certificates",
		Subcommands: []*cli.Command{
			{
				Name:  "check",
				Usage: fmt.Sprintf("list each certificate with its expiry, days left and OK, WARN (due: running kelp renews a leaf within the hour, never a CA) or EXPIRED; exit status %d if one expired, %d if one is due", exitExpired, exitWarn),
				Flags: config.NodeFlags(),
				Action: config.WithDataDir(func(c *cli.Context, dataDir string) error {
					return check(c.App.Writer, dataDir, time.Now())
				}),
			},
			{
				Name:  "rotate",
				Usage: "move a stopped server's leaf certificates aside so that it issues new ones when it starts; CAs are kept",
				Flags: append(config.NodeFlags(), &cli.StringSliceFlag{Name: "service", Usage: "rotate only this service's certificates (repeatable): " + fmt.Sprint(pki.FilesIn("").ServiceNames())}),
				Action: config.WithDataDir(func(c *cli.Context, dataDir string) error {
					return rotate(c.App.Writer, dataDir, config.List(c.StringSlice("service")), time.Now())
				}),
			},
			{
				Name:  "rotate-ca",
				Usage: "replace a stopped server's certificate authorities, in two steps that keep joined nodes working: rotate-ca, then rotate-ca --finish once every node has the new CAs (see README, Certificates)",
				Flags: []cli.Flag{
					config.ConfigFlag(), config.DataDirFlag(),
					&cli.StringFlag{Name: "path", Usage: "directory with the new CAs, named as in <data-dir>/server/tls (server-ca.crt/.key, client-ca, request-header-ca, etcd/server-ca, etcd/peer-ca); default: make new ones"},
					&cli.BoolFlag{Name: "finish", Usage: "end a rotation: stop trusting the old CAs"},
				},
				Action: config.WithDataDir(func(c *cli.Context, dataDir string) error {
					return rotateCA(c.App.Writer, dataDir, c.String("path"), c.Bool("finish"), time.Now())
				}),
			},
		},
	}
}

func check(w io.Writer, dataDir string, now time.Time) error {
	var all []pki.CertStatus
	for _, dir := range []string{layout.Server(dataDir).TLS, layout.Agent(dataDir).TLS} {
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			continue
		}
		list, err := pki.Check(dir, now)
		if err != nil {
			return err
		}
		all = append(all, list...)
	}
	if len(all) == 0 {
		return fmt.Errorf("no certificates in %s: give the --data-dir of a kelp server or agent", dataDir)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CERTIFICATE\tSUBJECT\tEXPIRES\tDAYS LEFT\tSTATUS")
	worst := pki.StatusOK
	for _, s := range all {
		subject := s.Subject
		switch {
		case len(s.AlsoTrusted) > 0:
			subject += fmt.Sprintf(" (CA; also trusts %s until rotate-ca --finish)", strings.Join(s.AlsoTrusted, ", "))
		case s.CA:
			subject += " (CA)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", s.Path, subject, s.NotAfter.UTC().Format(time.RFC3339), s.DaysLeft, s.Status)
		if s.Status == pki.StatusExpired || (s.Status == pki.StatusWarn && worst == pki.StatusOK) {
			worst = s.Status
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch worst {
	case pki.StatusExpired:
		return cli.Exit("a certificate has expired: kelp renews leaf certificates while it runs, so check that it runs and what it logged; starting it renews them too (on a stopped server, `kelp certificate rotate` first renews them all)", exitExpired)
	case pki.StatusWarn:
		return cli.Exit("", exitWarn)
	}
	return nil
}

func rotate(w io.Writer, dataDir string, services []string, now time.Time) error {
	dir := layout.Server(dataDir).TLS
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("%w: rotate runs on a server, with its --data-dir (an agent renews its certificates while it runs and gets new ones at every start)", err)
	}
	if err := os.MkdirAll(layout.Server(dataDir).DB, 0o700); err != nil {
		return err
	}
	release, err := datastore.Lock(dataDir)
	if err != nil {
		return fmt.Errorf("%w: stop kelp server first; it issues the new certificates when it starts again", err)
	}
	defer release()
	moved, err := pki.Rotate(dir, services, now)
	for _, path := range moved {
		fmt.Fprintln(w, "moved aside", path)
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "start kelp server: it issues new certificates for these from the same CAs")
	return nil
}

func rotateCA(w io.Writer, dataDir, from string, finish bool, now time.Time) error {
	dir := layout.Server(dataDir).TLS
	if _, err := os.Stat(dir); err != nil {
		if _, agentErr := os.Stat(layout.Agent(dataDir).TLS); agentErr == nil {
			return fmt.Errorf("%s is an agent's data dir: rotate-ca runs on the server, and agents pick up the new CAs from it while they run", dataDir)
		}
		return fmt.Errorf("%w: rotate-ca runs on a server, with its --data-dir", err)
	}
	if finish && from != "" {
		return errors.New("--finish takes no --path: it keeps the new CAs that rotate-ca put in place")
	}
	if from != "" {
		abs, err := filepath.Abs(from)
		if err != nil {
			return err
		}
		if st, err := os.Stat(abs); err != nil || !st.IsDir() {
			return fmt.Errorf("--path %s: not a directory (%v): give the directory that holds the new CAs", from, err)
		}
		from = abs
	}
	if datastore.LocalKind(dataDir) == datastore.KindEtcd {
		return errors.New("this server runs embedded etcd: rotate-ca supports a cluster with one server (SQLite, or one server on an external datastore), " +
			"since every server of a cluster must change its CAs at once and kelp does not coordinate that yet; to replace the CAs of this cluster, " +
			"take a `kelp snapshot save` and set up a new cluster")
	}
	if err := os.MkdirAll(layout.Server(dataDir).DB, 0o700); err != nil {
		return err
	}
	release, err := datastore.Lock(dataDir)
	if err != nil {
		return fmt.Errorf("%w: stop kelp server first; it issues certificates from the new CAs when it starts again", err)
	}
	defer release()
	if finish {
		changed, err := pki.FinishCARotation(dir, now)
		if err != nil {
			return err
		}
		for _, path := range changed {
			fmt.Fprintln(w, "trusts only its new CA now:", path)
		}
		fmt.Fprintln(w, "start kelp server: it issues its certificates again without the old CAs' signatures, and nodes renew theirs within a few minutes. "+
			"Join new nodes with the token in <data-dir>/server/token (its CA hash changed); nodes that joined keep working with the token they have. "+
			"Copy kubeconfigs made from /etc/kelp/kelp.yaml again.")
		return nil
	}
	changed, err := pki.RotateCA(dir, from, now)
	if err != nil {
		return err
	}
	for _, path := range changed {
		fmt.Fprintln(w, "new CA, trusting the old one too:", path)
	}
	fmt.Fprintln(w, "start kelp server: it issues its certificates from the new CAs, and every node renews its own within a few minutes while it runs. "+
		"Once `kelp certificate check` on each node shows the new CAs, and five minutes more have passed, stop the server and run `kelp certificate rotate-ca --finish`.")
	return nil
}
