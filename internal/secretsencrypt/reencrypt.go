package secretsencrypt

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/kelp-dev/kelp/internal/datastore"
)

const (
	secretsPrefix = "/registry/secrets/"
	// encryptedPrefix starts every value the apiserver encrypted with a
	// secretbox key; the key's name and a colon follow.
	encryptedPrefix = "k8s:enc:" + Provider + ":v1:"
	// reencryptTimeout bounds the wait for the apiservers to load a changed
	// configuration (they look every ReloadInterval) and the rewrite.
	reencryptTimeout = 3 * time.Minute
)

// ReloadInterval is how often the apiserver looks for a changed
// configuration file; kelp sets it (upstream's default is a minute).
const ReloadInterval = 10 * time.Second

// Stored counts the Secrets in the datastore by what they are stored
// with: a key's name, or "identity" for the clear.
func Stored(ctx context.Context, be datastore.Backend) (map[string]int, error) {
	cli, err := datastore.NewClient(be)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, secretsPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read the Secrets in the datastore: %w", err)
	}
	counts := map[string]int{}
	for _, kv := range resp.Kvs {
		counts[storedWith(kv.Value)]++
	}
	return counts, nil
}

func storedWith(value []byte) string {
	rest, ok := bytes.CutPrefix(value, []byte(encryptedPrefix))
	if !ok {
		return "identity"
	}
	name, _, _ := strings.Cut(string(rest), ":")
	return name
}

// Reencrypt rewrites every Secret through the apiserver until the
// datastore holds each with the active key (or in the clear, with
// encryption off), then drops the keys nothing needs any more. It may be
// run again after a crash: a Secret already stored right is not written.
func Reencrypt(ctx context.Context, path string, c kubernetes.Interface, be datastore.Backend) (map[string]int, error) {
	cfg, ok, err := Load(path)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("secrets encryption was never enabled on this server (%s does not exist)", path)
	}
	ctx, cancel := context.WithTimeout(ctx, reencryptTimeout)
	defer cancel()
	for {
		if err := rewriteAll(ctx, c); err != nil {
			return nil, err
		}
		counts, err := Stored(ctx, be)
		if err != nil {
			return nil, err
		}
		if counts[cfg.Active()] == total(counts) {
			return counts, dropUnused(path)
		}
		// The apiserver writes with the new configuration once it has
		// loaded it; until then an unchanged Secret is not written.
		select {
		case <-ctx.Done():
			return counts, fmt.Errorf("some Secrets are still stored with other keys after %s (%v): is every server's %s the same? run reencrypt again", reencryptTimeout, counts, path)
		case <-time.After(ReloadInterval / 2):
		}
	}
}

// rewriteAll writes every Secret back unchanged: the apiserver stores one
// read with a key that no longer writes anew with the one that does.
func rewriteAll(ctx context.Context, c kubernetes.Interface) error {
	list, err := c.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list Secrets: %w", err)
	}
	for _, s := range list.Items {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := c.CoreV1().Secrets(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			_, err = c.CoreV1().Secrets(s.Namespace).Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("rewrite Secret %s/%s: %w", s.Namespace, s.Name, err)
		}
	}
	return nil
}

func total(counts map[string]int) int {
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}
