package secretsencrypt

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/layout"
)

// Command is `kelp secrets-encrypt`, run on a server while it runs.
func Command() *cli.Command {
	flags := config.NodeFlags()
	step := func(name, usage string, do func(path string) error) *cli.Command {
		return &cli.Command{Name: name, Usage: usage, Flags: flags, Action: config.WithDataDir(func(c *cli.Context, dataDir string) error {
			path := layout.Server(dataDir).EncryptionConfig
			if err := do(path); err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "%s: done; the apiserver loads %s within %s\n", name, path, ReloadInterval)
			return status(c.Context, c.App.Writer, dataDir)
		})}
	}
	return &cli.Command{
		Name:  "secrets-encrypt",
		Usage: "encryption of Secrets at rest: status, enable, disable, and key rotation (prepare, rotate, reencrypt, or rotate-keys for all three)",
		Subcommands: []*cli.Command{
			{Name: "status", Usage: "say whether Secrets are encrypted, with which keys, and how each Secret in the datastore is stored", Flags: flags,
				Action: config.WithDataDir(func(c *cli.Context, dataDir string) error { return status(c.Context, c.App.Writer, dataDir) })},
			step("enable", "encrypt new writes (with a new key if there is none); `reencrypt` then encrypts the Secrets already stored", func(path string) error { return Enable(path, time.Now()) }),
			step("disable", "write Secrets in the clear again; `reencrypt` then decrypts the ones stored", Disable),
			step("prepare", "add a new key that decrypts but does not yet encrypt (on every server first, when there are several)", func(path string) error { return Prepare(path, time.Now()) }),
			step("rotate", "make the key added by prepare the one that encrypts", Rotate),
			{Name: "reencrypt", Usage: "rewrite every Secret with the key that encrypts (or in the clear), then drop the keys no longer needed", Flags: flags,
				Action: config.WithDataDir(func(c *cli.Context, dataDir string) error { return reencrypt(c.Context, c.App.Writer, dataDir) })},
			{Name: "rotate-keys", Usage: "prepare, rotate and reencrypt in one go, on a cluster with one server", Flags: flags,
				Action: config.WithDataDir(func(c *cli.Context, dataDir string) error {
					path := layout.Server(dataDir).EncryptionConfig
					if err := Prepare(path, time.Now()); err != nil {
						return err
					}
					// The apiserver must read with the new key before
					// anything is written with it.
					time.Sleep(2 * ReloadInterval)
					if err := Rotate(path); err != nil {
						return err
					}
					return reencrypt(c.Context, c.App.Writer, dataDir)
				})},
		},
	}
}

func reencrypt(ctx context.Context, w io.Writer, dataDir string) error {
	paths := layout.Server(dataDir)
	rc, err := clientcmd.BuildConfigFromFlags("", paths.AdminKubeconfig)
	if err != nil {
		return fmt.Errorf("%w: run it on a server, with its --data-dir", err)
	}
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	be, err := datastore.LocalBackend(dataDir)
	if err != nil {
		return err
	}
	if _, err := Reencrypt(ctx, paths.EncryptionConfig, c, be); err != nil {
		return err
	}
	fmt.Fprintln(w, "reencrypt: every Secret is stored with the key that encrypts; the others are dropped")
	return status(ctx, w, dataDir)
}

func status(ctx context.Context, w io.Writer, dataDir string) error {
	path := layout.Server(dataDir).EncryptionConfig
	cfg, ok, err := Load(path)
	if err != nil {
		return err
	}
	switch {
	case !ok:
		fmt.Fprintln(w, "Encryption: disabled (never enabled: kelp server --secrets-encryption, or kelp secrets-encrypt enable)")
	case cfg.Enabled:
		fmt.Fprintf(w, "Encryption: enabled (%s), new writes with %s\n", Provider, cfg.Active())
	default:
		fmt.Fprintln(w, "Encryption: disabled, new writes in the clear")
	}
	var names []string
	for _, k := range cfg.Keys {
		names = append(names, k.Name)
	}
	if len(names) > 0 {
		fmt.Fprintf(w, "Keys: %s\n", strings.Join(names, ", "))
	}
	be, err := datastore.LocalBackend(dataDir)
	if err != nil {
		return err
	}
	counts, err := Stored(ctx, be)
	if err != nil {
		return fmt.Errorf("%w: is kelp server running?", err)
	}
	var parts []string
	for with, n := range counts {
		how := "with " + with
		if with == "identity" {
			how = "in the clear"
		}
		parts = append(parts, fmt.Sprintf("%d %s", n, how))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		parts = []string{"none"}
	}
	fmt.Fprintf(w, "Secrets in the datastore: %s\n", strings.Join(parts, ", "))
	return nil
}
