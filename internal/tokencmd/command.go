// Package tokencmd is `kelp token`: the join tokens of a server, made,
// listed, deleted and rotated on it.
package tokencmd

import (
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/token"
)

// Command is `kelp token`: the join tokens of a server, run on it.
func Command() *cli.Command {
	// The server's config file gives these commands its data dir.
	flags := append(config.NodeFlags(),
		&cli.StringFlag{Name: "kubeconfig", Usage: "admin kubeconfig (default: <data-dir>/server/cred/admin.kubeconfig)"})
	return &cli.Command{
		Name:  "token",
		Usage: "make, list, delete and rotate the tokens nodes join with (on a server)",
		Subcommands: []*cli.Command{
			{
				Name:  "create",
				Usage: "make a join token for agents, printed once",
				Flags: append(flags,
					&cli.DurationFlag{Name: "ttl", Value: 24 * time.Hour, Usage: "how long the token joins nodes (0: forever)"},
					&cli.StringFlag{Name: "description", Usage: "what the token is for"}),
				Action: func(c *cli.Context) error {
					client, hash, err := tokenContext(c)
					if err != nil {
						return err
					}
					secret, err := token.CreateBootstrap(c.Context, client, c.Duration("ttl"), c.String("description"))
					if err != nil {
						return err
					}
					fmt.Fprintln(c.App.Writer, token.Token{CAHash: hash, User: token.NodeUser, Secret: secret})
					return nil
				},
			},
			{
				Name:  "list",
				Usage: "list the tokens `kelp token create` made",
				Flags: flags,
				Action: func(c *cli.Context) error {
					client, _, err := tokenContext(c)
					if err != nil {
						return err
					}
					list, err := token.ListBootstrap(c.Context, client)
					if err != nil {
						return err
					}
					w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
					fmt.Fprintln(w, "ID\tEXPIRES\tDESCRIPTION")
					for _, b := range list {
						expires := "never"
						if !b.Expires.IsZero() {
							expires = b.Expires.Format(time.RFC3339)
						}
						fmt.Fprintf(w, "%s\t%s\t%s\n", b.ID, expires, b.Description)
					}
					return w.Flush()
				},
			},
			{
				Name:      "delete",
				Usage:     "delete tokens by ID",
				ArgsUsage: "ID...",
				Flags:     flags,
				Action: func(c *cli.Context) error {
					if !c.Args().Present() {
						return fmt.Errorf("name the tokens to delete: kelp token delete ID... (kelp token list shows them)")
					}
					client, _, err := tokenContext(c)
					if err != nil {
						return err
					}
					for _, id := range c.Args().Slice() {
						if err := token.DeleteBootstrap(c.Context, client, id); err != nil {
							return err
						}
					}
					return nil
				},
			},
			{
				Name:  "rotate",
				Usage: "give the server token a new secret; nodes that joined keep working, new ones need the new token",
				Flags: append(config.NodeFlags(),
					&cli.StringFlag{Name: "new-token", Usage: "the new secret (default: a random one); --new-token-file keeps it out of ps"},
					&cli.StringFlag{Name: "new-token-file", Usage: "file holding the new secret"}),
				Action: func(c *cli.Context) error {
					secret, err := token.FromFlagOrFile("new-token", c.String("new-token"), "new-token-file", c.String("new-token-file"))
					if err != nil {
						return err
					}
					if err := token.CheckChosen("--new-token", secret); err != nil {
						return err
					}
					dataDir, err := config.DataDir(c)
					if err != nil {
						return err
					}
					hash, err := caHash(dataDir)
					if err != nil {
						return err
					}
					if secret == "" {
						if secret, err = token.Random(); err != nil {
							return err
						}
					}
					t, err := token.Ensure(layout.Server(dataDir).Token, token.ServerUser, secret, hash)
					if err != nil {
						return err
					}
					fmt.Fprintln(c.App.Writer, t)
					fmt.Fprintln(c.App.ErrWriter, "kelp: if the server runs with --token (or token: in its config file), change it there too")
					fmt.Fprintln(c.App.ErrWriter, "kelp: snapshots saved before now are authenticated with the old secret: keep the old token to restore them (kelp snapshot restore --token-file)")
					return nil
				},
			},
		},
	}
}

// tokenContext is an admin client and the CA hash of the server in
// --data-dir.
func tokenContext(c *cli.Context) (kubernetes.Interface, string, error) {
	dataDir, err := config.DataDir(c)
	if err != nil {
		return nil, "", err
	}
	hash, err := caHash(dataDir)
	if err != nil {
		return nil, "", err
	}
	kubeconfig := c.String("kubeconfig")
	if kubeconfig == "" {
		kubeconfig = layout.Server(dataDir).AdminKubeconfig
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, "", fmt.Errorf("load %s: %w (run kelp token on a server, or pass --kubeconfig)", kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(rc)
	return client, hash, err
}

func caHash(dataDir string) (string, error) {
	ca, err := os.ReadFile(pki.FilesIn(layout.Server(dataDir).TLS).ServerCA.Cert)
	if err != nil {
		return "", fmt.Errorf("read the cluster CA: %w (run kelp token on a server, with its --data-dir)", err)
	}
	return pki.CAHash(ca), nil
}
