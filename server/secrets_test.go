package server_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// TestSecretsEncryption reads a Secret's bytes straight from the
// datastore: in the clear in a cluster made with
// --secrets-encryption=false before `kelp secrets-encrypt enable` and
// `reencrypt`, encrypted after, with the new key after `rotate-keys`, and
// still readable through the API after a restart. A cluster made with
// kelp's defaults encrypts from the start. --secrets-encryption given to a
// single server made without encrypts its Secrets; a server sharing its
// datastore refuses it, naming the commands that encrypt every server.
func TestSecretsEncryption(t *testing.T) {
	t.Parallel()
	t.Run("default", func(t *testing.T) {
		t.Parallel()
		n := testcluster.NewNode(t)
		n.Start("--disable-agent")
		n.WaitReady(startTimeout)
		createPrecious(t, n.Client())
		out, err := n.RunKelp(time.Minute, "etcdctl", "--data-dir", n.DataDir, "get", "/registry/secrets/default/precious", "--print-value-only")
		if err != nil || !strings.HasPrefix(out, "k8s:enc:secretbox:v1:") || strings.Contains(out, "plain-sight") {
			t.Errorf("a Secret of a new cluster is stored as %.60q (%v), want encrypted with secretbox", out, err)
		}
	})
	t.Run("given to a cluster made without", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct{ name, init string }{{"sqlite", ""}, {"etcd", "--cluster-init"}} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				n := testcluster.NewNode(t)
				args := slices.DeleteFunc([]string{"--disable-agent", tc.init}, func(a string) bool { return a == "" })
				n.Start(append(args, "--secrets-encryption=false")...)
				n.WaitReady(startTimeout)
				createPrecious(t, n.Client())
				n.Stop()
				raw := func() string {
					out, _ := n.RunKelp(time.Minute, "etcdctl", "--data-dir", n.DataDir, "get", "/registry/secrets/default/precious", "--print-value-only")
					return out
				}
				if tc.init != "" {
					// The other servers of the datastore must encrypt too.
					out, err := n.RunKelp(2*time.Minute, n.ServerArgs(append(args, "--secrets-encryption")...)...)
					if err == nil || !strings.Contains(out, "run `kelp secrets-encrypt enable` on every server") {
						t.Errorf("an etcd server given --secrets-encryption on a cluster in the clear: %v, want a refusal naming the commands\n%s", err, tail(out))
					}
					n.Start(args...)
					n.WaitReady(startTimeout)
					if v := raw(); !strings.Contains(v, "plain-sight") {
						t.Errorf("after the refusal the Secret is stored as %.60q", v)
					}
					return
				}
				n.Start(append(args, "--secrets-encryption")...)
				n.WaitReady(startTimeout)
				testcluster.Eventually(t, "the Secret stored encrypted", func() (bool, error) {
					v := raw()
					return strings.HasPrefix(v, "k8s:enc:secretbox:v1:") && !strings.Contains(v, "plain-sight"), nil
				})
				n.WaitLog("Every Secret is stored encrypted", time.Minute)
				// Without the flag the server keeps reading and writing
				// encrypted.
				n.Stop()
				n.Start(args...)
				n.WaitReady(startTimeout)
				s, err := n.Client().CoreV1().Secrets("default").Get(context.Background(), "precious", metav1.GetOptions{})
				if err != nil || string(s.Data["password"]) != "plain-sight" {
					t.Errorf("after a restart without the flag: %v %q", err, s.Data["password"])
				}
			})
		}
	})
	n := testcluster.NewNode(t)
	n.Start("--secrets-encryption=false")
	n.WaitReady(startTimeout)
	c := n.Client()
	ctx := context.Background()
	createPrecious(t, c)
	raw := func() string {
		t.Helper()
		out, err := n.RunKelp(time.Minute, "etcdctl", "--data-dir", n.DataDir, "get", "/registry/secrets/default/precious", "--print-value-only")
		if err != nil {
			t.Fatalf("kelp etcdctl get: %v\n%s", err, out)
		}
		return out
	}
	encrypt := func(args ...string) string {
		t.Helper()
		out, err := n.RunKelp(4*time.Minute, append([]string{"secrets-encrypt"}, append(args, "--data-dir", n.DataDir)...)...)
		if err != nil {
			t.Fatalf("kelp secrets-encrypt %s: %v\n%s", args[0], err, out)
		}
		return out
	}
	if v := raw(); !strings.Contains(v, "plain-sight") {
		t.Fatalf("before encryption the datastore holds %q", v)
	}
	if out := encrypt("status"); !strings.Contains(out, "Encryption: disabled") || !strings.Contains(out, "1 in the clear") {
		t.Errorf("status before: %s", out)
	}
	encrypt("enable")
	encrypt("reencrypt")
	first := raw()
	if strings.Contains(first, "plain-sight") || !strings.HasPrefix(first, "k8s:enc:secretbox:v1:key-") {
		t.Fatalf("after reencrypt the datastore holds %q", first)
	}
	out := encrypt("rotate-keys")
	second := raw()
	if strings.Contains(second, "plain-sight") || second[:40] == first[:40] {
		t.Errorf("after rotate-keys: %q, before %q", second[:40], first[:40])
	}
	if !strings.Contains(out, "Secrets in the datastore:") || strings.Contains(out, "in the clear") {
		t.Errorf("status after rotate-keys:\n%s", out)
	}

	n.Stop()
	n.Start()
	n.WaitReady(startTimeout)
	c = n.Client()
	s, err := c.CoreV1().Secrets("default").Get(ctx, "precious", metav1.GetOptions{})
	if err != nil || string(s.Data["password"]) != "plain-sight" {
		t.Errorf("after a restart: %v %q", err, s.Data["password"])
	}

	// A rotation killed midway (after the new key writes, while Secrets
	// are being rewritten) loses no Secret, and reencrypt finishes it.
	const many = 150
	for i := range many {
		if _, err := c.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("more-%d", i)},
			Data:       map[string][]byte{"n": []byte(strconv.Itoa(i))},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rotation := n.Command(testcluster.Binary(t), "secrets-encrypt", "rotate-keys", "--data-dir", n.DataDir)
	if err := testcluster.Spawn(rotation); err != nil {
		t.Fatal(err)
	}
	// rotate-keys waits 20 s for the apiserver to read with the new key,
	// then makes it the writing one and rewrites the Secrets.
	time.Sleep(23 * time.Second)
	if err := rotation.Process.Kill(); err != nil {
		t.Fatalf("kill -9 kelp secrets-encrypt rotate-keys: %v", err)
	}
	_ = rotation.Wait()
	readAll := func(when string) {
		t.Helper()
		list, err := c.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("%s: list Secrets: %v", when, err)
		}
		found := 0
		for _, s := range list.Items {
			if strings.HasPrefix(s.Name, "more-") && string(s.Data["n"]) == strings.TrimPrefix(s.Name, "more-") {
				found++
			}
		}
		if found != many {
			t.Errorf("%s: %d of %d Secrets read back right", when, found, many)
		}
	}
	readAll("after rotate-keys was killed")
	out = encrypt("reencrypt")
	var keys, stored string
	for _, line := range strings.Split(out, "\n") {
		if k, ok := strings.CutPrefix(line, "Keys: "); ok {
			keys = k
		}
		if s, ok := strings.CutPrefix(line, "Secrets in the datastore: "); ok {
			stored = s
		}
	}
	if keys == "" || strings.Contains(keys, ",") || strings.Contains(stored, ",") || !strings.Contains(stored, keys) {
		t.Errorf("reencrypt after a killed rotation: want one key left and every Secret stored with it:\n%s", out)
	}
	readAll("after reencrypt")
}

// createPrecious creates the Secret default/precious, whose password
// "plain-sight" shows whether the datastore holds it in the clear.
func createPrecious(t *testing.T, c kubernetes.Interface) {
	t.Helper()
	if _, err := c.CoreV1().Secrets("default").Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "precious"},
		Data:       map[string][]byte{"password": []byte("plain-sight")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
