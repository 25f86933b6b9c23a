package server_test

import (
	"archive/tar"
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

// sharedImage is in no registry: its registry's name resolves to nothing.
const sharedImage = "registry.invalid/kelp-test/shared:1.0"

// sharedPods run image on the server's node and on agent-2, whose airgap
// dirs lack it.
func sharedPods(image string) string {
	return `
apiVersion: v1
kind: Pod
metadata: {name: shared-on-agent-2}
spec:
  nodeName: agent-2
  terminationGracePeriodSeconds: 0
  containers:
  - {name: app, image: ` + image + `, args: [serve]}
---
apiVersion: v1
kind: Pod
metadata: {name: shared-on-server}
spec:
  nodeName: server
  terminationGracePeriodSeconds: 0
  containers:
  - {name: app, image: ` + image + `, args: [serve]}
`
}

// imageDigest returns the digest of the one image of the OCI image
// tarball at path.
func imageDigest(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s: no index.json: %v", path, err)
		}
		if strings.TrimPrefix(h.Name, "./") != "index.json" {
			continue
		}
		var index ocispec.Index
		if err := json.NewDecoder(tr).Decode(&index); err != nil || len(index.Manifests) != 1 {
			t.Fatalf("%s: want an index.json of one image (%v)", path, err)
		}
		return index.Manifests[0].Digest.String()
	}
}

// TestEmbeddedRegistry: with --embedded-registry and the image's registry
// among the mirrors of every node's registries.yaml, an image only agent-1
// has (from its airgap dir) runs by digest on agent-2 and on the server's
// node, with no registry reachable at all (a tag is the registry's to
// resolve); agent-1's mirror serves nodes of the cluster only.
func TestEmbeddedRegistry(t *testing.T) {
	t.Parallel()
	lab := testcluster.NewLab(t)
	registries := filepath.Join(t.TempDir(), "registries.yaml")
	if err := os.WriteFile(registries, []byte("mirrors:\n  registry.invalid:\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := lab.NewNode("server", "10.99.0.2")
	srv.Agent = true
	srv.Start("--embedded-registry", "--private-registry", registries)
	srv.WaitReady(startTimeout)
	agent1, agent2 := lab.NewNode("agent-1", "10.99.0.3"), lab.NewNode("agent-2", "10.99.0.4")
	image := testcluster.BuildTestImage(t, sharedImage)
	agent1.AddImage(image)
	digest := imageDigest(t, image)
	for _, a := range []*testcluster.Node{agent1, agent2} {
		a.StartAgent(srv.URL(), srv.TokenFile(), "--private-registry", registries)
	}
	for _, n := range []*testcluster.Node{srv, agent1, agent2} {
		n.WaitLog("registry mirror serving", startTimeout)
		n.WaitLog("kelp node is running", startTimeout)
	}
	c := srv.Client()
	waitNodesReady(t, c, 3)
	waitServiceAccount(t, c, "default")
	apply(t, srv, sharedPods("registry.invalid/kelp-test/shared@"+digest))
	kubectl(t, srv, "wait", "--for=condition=Ready", "pod/shared-on-agent-2", "pod/shared-on-server", "--timeout=55s")
	// Pulled by digest, the image has no tag: crictl finds it by its
	// reference with the digest.
	if out, err := agent2.RunKelp(time.Minute, "crictl", "inspecti", "registry.invalid/kelp-test/shared@"+digest); err != nil {
		t.Errorf("agent-2 lacks the image it pulled from agent-1: %v\n%s", err, out)
	}

	t.Run("agent-1 serves nodes of the cluster only", func(t *testing.T) {
		const manifests = "https://10.99.0.3:5001/v2/kelp-test/shared/manifests/"
		byDigest := manifests + digest + "?ns=registry.invalid"
		head := func(url string, cert *tls.Certificate) (*http.Response, error) {
			cfg := &tls.Config{InsecureSkipVerify: true} // what is tested is agent-1's check of the client
			if cert != nil {
				cfg.Certificates = []tls.Certificate{*cert}
			}
			client := http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DialContext: srv.DialContext}}
			req, err := http.NewRequestWithContext(context.Background(), http.MethodHead, url, nil)
			if err != nil {
				t.Fatal(err)
			}
			return client.Do(req)
		}
		rc := srv.RestConfig()
		admin, err := tls.X509KeyPair(rc.CertData, rc.KeyData)
		if len(rc.CertData) == 0 {
			admin, err = tls.LoadX509KeyPair(rc.CertFile, rc.KeyFile)
		}
		if err != nil {
			t.Fatalf("the admin kubeconfig's certificate: %v", err)
		}
		node := pki.NodeFilesIn(layout.Agent(agent2.DataDir).TLS).Controller
		agent2Cert, err := tls.LoadX509KeyPair(node.Cert, node.Key)
		if err != nil {
			t.Fatal(err)
		}
		for what, cert := range map[string]*tls.Certificate{"no certificate": nil, "the cluster admin's certificate": &admin} {
			if resp, err := head(byDigest, cert); err == nil {
				resp.Body.Close()
				t.Errorf("%s: served, %s", what, resp.Status)
			} else if !strings.Contains(err.Error(), "certificate") {
				t.Errorf("%s: refused for another reason: %v", what, err)
			}
		}
		if resp, err := head(byDigest, &agent2Cert); err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("agent-2's certificate: %v %v", resp, err)
		}
		if resp, err := head(manifests+"1.0?ns=registry.invalid", &agent2Cert); err != nil || resp.StatusCode != http.StatusNotFound {
			t.Errorf("a tag, with agent-2's certificate: %v %v", resp, err)
		}
	})
}
