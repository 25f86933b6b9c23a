package snapshot

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/nodeevent"
	"github.com/kelp-dev/kelp/internal/token"
)

// Command is `kelp snapshot`: snapshots of a server's datastore, run on it.
func Command() *cli.Command {
	var in config.SnapshotStoreInput
	// The server's config file gives these commands its data dir and
	// snapshot settings.
	flags := slices.Concat(config.NodeFlags(), []cli.Flag{
		&cli.StringFlag{Name: "datastore-endpoint", EnvVars: []string{"KELP_DATASTORE_ENDPOINT"}, Usage: "the server's --datastore-endpoint, if any: external datastores are not snapshotted by kelp"},
		&cli.StringFlag{Name: "node-name", EnvVars: []string{"KELP_NODE_NAME"}, Usage: "the server's node name, which names its snapshots and says which are its own to prune (default: the hostname)"},
	}, config.SnapshotStoreFlags(&in))
	// parse returns the snapshot directory and where snapshots are kept.
	parse := func(c *cli.Context) (Dir, config.SnapshotStore, error) {
		if c.String("datastore-endpoint") != "" {
			return Dir{}, config.SnapshotStore{}, errors.New("kelp snapshot covers SQLite and embedded etcd only: " + externalHint)
		}
		store, err := in.Parse()
		if err != nil {
			return Dir{}, config.SnapshotStore{}, err
		}
		dataDir, err := config.DataDir(c)
		if err != nil {
			return Dir{}, config.SnapshotStore{}, err
		}
		return Dir{DataDir: dataDir, Path: store.Dir, Node: strings.ToLower(c.String("node-name"))}, store, nil
	}
	// open returns the snapshot directory and, with --snapshot-s3, the S3
	// folder, checked to be reachable before anything is changed.
	open := func(c *cli.Context) (Dir, *remote, error) {
		d, store, err := parse(c)
		if err != nil || store.S3 == nil {
			return d, nil, err
		}
		r, err := openS3(c.Context, *store.S3)
		return d, r, err
	}
	return &cli.Command{
		Name:  "snapshot",
		Usage: "save, list, delete, prune and restore snapshots of the server's datastore (on a server), locally and with --snapshot-s3 on S3",
		Subcommands: []*cli.Command{
			{
				Name:  "save",
				Usage: "take a snapshot of the running or stopped server's SQLite or embedded etcd datastore and keep it locally; with --snapshot-s3 then copy it, and this node's snapshots saved while S3 was down, to S3",
				Flags: slices.Concat(flags, []cli.Flag{&cli.StringFlag{Name: "name", Value: DefaultName, Usage: "start of the snapshot's file name; the node name and UTC time follow"}}),
				Action: func(c *cli.Context) error {
					// The snapshot is kept locally before S3 is asked
					// anything: an S3 that is down must not cost it.
					d, store, err := parse(c)
					if err != nil {
						return err
					}
					m, err := d.Save(c.Context, c.String("name"))
					if err != nil {
						return err
					}
					path := filepath.Join(d.path(), m.Name)
					fmt.Fprintf(c.App.Writer, "saved %s (%s, %d bytes) in %s\n", m.Name, m.Datastore, m.Size, d.path())
					if store.S3 == nil {
						return nil
					}
					r, uploaded, err := d.offsite(c.Context, *store.S3, m)
					for _, name := range uploaded {
						fmt.Fprintf(c.App.Writer, "uploaded %s\n", r.location(name))
					}
					if err != nil {
						// On a running server, the failure shows on its Node
						// as a scheduled one's does.
						if events, cerr := nodeevent.Client(layout.Server(d.DataDir).AdminKubeconfig); cerr == nil {
							warnUploadFailed(c.Context, events, d.node(), *store.S3, m, d.path(), err)
						}
						return fmt.Errorf("%w; the local snapshot %s is kept, and is uploaded by the next save once S3 answers", err, path)
					}
					return nil
				},
			},
			{
				Name:    "ls",
				Aliases: []string{"list"},
				Usage:   "list snapshots, local and with --snapshot-s3 on S3, newest first; incomplete ones (no valid metadata) last, marked as such",
				Flags:   flags,
				Action: func(c *cli.Context) error {
					d, r, err := open(c)
					if err != nil {
						return err
					}
					list, err := listAll(c.Context, stores(d, r))
					if err != nil {
						return err
					}
					w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
					fmt.Fprintln(w, "NAME\tSIZE\tCREATED\tDATASTORE\tLOCATION")
					for _, s := range list {
						created, kind := "-", "incomplete: "+s.Problem
						if s.Meta != nil {
							created, kind = s.Meta.Created.Format(time.RFC3339), s.Meta.Datastore
						}
						fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\n", s.Name, s.Size, created, kind, s.Location)
					}
					return w.Flush()
				},
			},
			{
				Name:      "delete",
				Usage:     "delete snapshots by name, locally and with --snapshot-s3 on S3",
				ArgsUsage: "NAME...",
				Flags:     flags,
				Action: func(c *cli.Context) error {
					if !c.Args().Present() {
						return errors.New("name the snapshots to delete: kelp snapshot delete NAME... (kelp snapshot ls shows them)")
					}
					d, r, err := open(c)
					if err != nil {
						return err
					}
					return removeEverywhere(c.Context, stores(d, r), c.Args().Slice())
				},
			},
			{
				Name:  "prune",
				Usage: "keep this node's newest --retention snapshots named as kelp names them, locally and with --snapshot-s3 on S3 each; delete its older ones and incomplete ones left by an interrupted save",
				Flags: slices.Concat(flags, []cli.Flag{
					&cli.IntFlag{Name: "retention", Value: 5, Usage: "how many snapshots to keep"},
					&cli.BoolFlag{Name: "all-nodes", Usage: "prune the snapshots of every node in the snapshot directory and S3 folder together, not only this node's"},
				}),
				Action: func(c *cli.Context) error {
					d, r, err := open(c)
					if err != nil {
						return err
					}
					sel := selection{node: d.node()}
					if c.Bool("all-nodes") {
						sel.node = ""
					}
					// S3 first: if it fails, nothing local is deleted.
					for _, s := range stores(d, r) {
						removed, err := prune(c.Context, s, c.Int("retention"), sel)
						for _, name := range removed {
							fmt.Fprintln(c.App.Writer, "deleted", s.location(name))
						}
						if err != nil {
							return err
						}
					}
					temps, err := d.removeStaleTemps()
					for _, name := range temps {
						fmt.Fprintln(c.App.Writer, "deleted", d.location(name))
					}
					return err
				},
			},
			{
				Name:      "restore",
				Usage:     "put a SQLite snapshot in place of the stopped server's database, keeping the replaced one; with --snapshot-s3 a snapshot that is only on S3 is fetched first",
				ArgsUsage: "NAME",
				Flags: slices.Concat(flags, []cli.Flag{
					&cli.BoolFlag{Name: "force", Usage: "restore a snapshot even if it comes from another cluster (another server CA)"},
					&cli.StringFlag{Name: "token-file", EnvVars: []string{"KELP_TOKEN_FILE"}, Usage: "file holding the cluster's server token (or its secret), which authenticates snapshots: on a new machine, or for a snapshot saved before a `kelp token rotate` (default: <data-dir>/server/token)"},
					&cli.StringFlag{Name: "token", EnvVars: []string{"KELP_TOKEN"}, Usage: "the server token, as --token-file; from the config file or environment, --token-file keeps it out of ps"},
				}),
				Action: func(c *cli.Context) error {
					if c.Args().Len() != 1 {
						return errors.New("name one snapshot to restore: kelp snapshot restore NAME (kelp snapshot ls shows them)")
					}
					name := c.Args().First()
					d, store, err := parse(c)
					if err != nil {
						return err
					}
					if d.Token, err = restoreToken(c); err != nil {
						return err
					}
					found, err := d.Find(c.Context, name, store.S3)
					if err != nil {
						return err
					}
					if found.FetchedFrom != "" {
						fmt.Fprintf(c.App.Writer, "fetched %s into %s\n", found.FetchedFrom, found.Path)
					}
					res, err := d.Restore(found.Path, Target{Kind: datastore.KindSQLite, Force: c.Bool("force")})
					if err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "restored %s into %s\n", name, res.DB)
					if res.Backup != "" {
						fmt.Fprintf(c.App.Writer, "the replaced database is %s\n", res.Backup)
					}
					fmt.Fprintln(c.App.Writer, "start kelp server again")
					return nil
				},
			},
		},
	}
}

// restoreToken is the server token given to a restore, if any.
func restoreToken(c *cli.Context) (string, error) {
	return token.FromFlagOrFile("token", c.String("token"), "token-file", c.String("token-file"))
}
