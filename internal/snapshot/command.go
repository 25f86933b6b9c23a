package snapshot

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/layout"
)

// Command is `kelp snapshot`: snapshots of a server's datastore, run on it.
func Command() *cli.Command {
	flags := []cli.Flag{
		&cli.StringFlag{Name: "data-dir", Aliases: []string{"d"}, EnvVars: []string{"KELP_DATA_DIR"}, Value: layout.DefaultDataDir, Usage: "data dir of the server"},
		&cli.StringFlag{Name: "snapshot-dir", EnvVars: []string{"KELP_SNAPSHOT_DIR"}, Usage: "where snapshots are (default: <data-dir>/server/db/snapshots)"},
		&cli.StringFlag{Name: "datastore-endpoint", EnvVars: []string{"KELP_DATASTORE_ENDPOINT"}, Usage: "the server's --datastore-endpoint, if any: external datastores are not snapshotted by kelp"},
	}
	dir := func(c *cli.Context) (Dir, error) {
		if c.String("datastore-endpoint") != "" {
			return Dir{}, errors.New("kelp snapshot covers SQLite and embedded etcd only: " + externalHint)
		}
		return Dir{DataDir: c.String("data-dir"), Path: c.String("snapshot-dir")}, nil
	}
	return &cli.Command{
		Name:  "snapshot",
		Usage: "save, list, delete, prune and restore snapshots of the server's datastore (on a server)",
		Subcommands: []*cli.Command{
			{
				Name:  "save",
				Usage: "take a snapshot of the running or stopped server's SQLite or embedded etcd datastore",
				Flags: append(flags, &cli.StringFlag{Name: "name", Value: DefaultName, Usage: "start of the snapshot's file name; the node name and UTC time follow"}),
				Action: func(c *cli.Context) error {
					d, err := dir(c)
					if err != nil {
						return err
					}
					m, err := d.Save(c.Context, c.String("name"))
					if err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "saved %s (%s, %d bytes) in %s\n", m.Name, m.Datastore, m.Size, d.path())
					return nil
				},
			},
			{
				Name:    "ls",
				Aliases: []string{"list"},
				Usage:   "list snapshots, newest first; incomplete ones (no valid metadata) last, marked as such",
				Flags:   flags,
				Action: func(c *cli.Context) error {
					d, err := dir(c)
					if err != nil {
						return err
					}
					list, err := d.List()
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
						fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\n", s.Name, s.Size, created, kind, s.Path)
					}
					return w.Flush()
				},
			},
			{
				Name:      "delete",
				Usage:     "delete snapshots by name",
				ArgsUsage: "NAME...",
				Flags:     flags,
				Action: func(c *cli.Context) error {
					if !c.Args().Present() {
						return errors.New("name the snapshots to delete: kelp snapshot delete NAME... (kelp snapshot ls shows them)")
					}
					d, err := dir(c)
					if err != nil {
						return err
					}
					return d.Delete(c.Args().Slice()...)
				},
			},
			{
				Name:  "prune",
				Usage: "keep the newest --retention snapshots, delete older ones and incomplete ones left by an interrupted save",
				Flags: append(flags, &cli.IntFlag{Name: "retention", Value: 5, Usage: "how many snapshots to keep"}),
				Action: func(c *cli.Context) error {
					d, err := dir(c)
					if err != nil {
						return err
					}
					removed, err := d.Prune(c.Int("retention"))
					for _, name := range removed {
						fmt.Fprintln(c.App.Writer, "deleted", name)
					}
					return err
				},
			},
			{
				Name:      "restore",
				Usage:     "put a SQLite snapshot in place of the stopped server's database, keeping the replaced one",
				ArgsUsage: "NAME",
				Flags:     append(flags, &cli.BoolFlag{Name: "force", Usage: "restore a snapshot even if it comes from another cluster (another server CA)"}),
				Action: func(c *cli.Context) error {
					if c.Args().Len() != 1 {
						return errors.New("name one snapshot to restore: kelp snapshot restore NAME (kelp snapshot ls shows them)")
					}
					d, err := dir(c)
					if err != nil {
						return err
					}
					r, err := d.Restore(c.Args().First(), c.Bool("force"))
					if err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "restored %s into %s\n", c.Args().First(), r.DB)
					if r.Backup != "" {
						fmt.Fprintf(c.App.Writer, "the replaced database is %s\n", r.Backup)
					}
					fmt.Fprintln(c.App.Writer, "start kelp server again")
					return nil
				},
			},
		},
	}
}
