package cluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kelp-dev/kelp/internal/atomicfile"
)

// Context is the name of a cluster's cluster, user and context in
// kubeconfigs, as kind and k3d name theirs.
func Context(name string) string { return "kelp-" + name }

// writeKubeconfig writes the cluster's kubeconfig, made from the admin
// kubeconfig its first server wrote, with the address the host reaches
// the servers at (the forwarder's) and the cluster's context name. It says so if the server
// has not written one yet.
func writeKubeconfig(dir string, s *State) (*clientcmdapi.Config, error) {
	first := s.Nodes[0]
	admin, err := clientcmd.LoadFromFile(paths{dir}.node(first.Name).kubeconfig())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("server %s has no admin kubeconfig yet: it is still starting (its log: %s)", first.Name, paths{dir}.node(first.Name).log())
	}
	if err != nil {
		return nil, err
	}
	ctx, ok := admin.Contexts[admin.CurrentContext]
	if !ok || admin.Clusters[ctx.Cluster] == nil || admin.AuthInfos[ctx.AuthInfo] == nil {
		return nil, fmt.Errorf("the admin kubeconfig of server %s has no current context", first.Name)
	}
	name := Context(s.Name)
	cluster := admin.Clusters[ctx.Cluster].DeepCopy()
	cluster.Server = "https://" + hostAddr(s.APIPort)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = cluster
	cfg.AuthInfos[name] = admin.AuthInfos[ctx.AuthInfo].DeepCopy()
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	cfg.CurrentContext = name
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, err
	}
	return cfg, atomicfile.Write(paths{dir}.kubeconfig(), data, 0o600)
}

// Kubeconfig returns the path of the cluster's kubeconfig, written anew
// from its first server's.
func Kubeconfig(root, name string) (string, error) {
	dir := filepath.Join(root, name)
	s, err := load(dir)
	if err != nil {
		return "", notFound(name, err)
	}
	if _, err := writeKubeconfig(dir, s); err != nil {
		return "", err
	}
	return paths{dir}.kubeconfig(), nil
}

// DefaultKubeconfig is the kubeconfig kubectl uses by default: the first
// file of $KUBECONFIG, else ~/.kube/config.
func DefaultKubeconfig() string {
	return clientcmd.NewDefaultPathOptions().GetDefaultFilename()
}

// mergeKubeconfig puts the cluster's context into the kubeconfig at path,
// replacing one of the same name, and makes it the current context.
func mergeKubeconfig(path string, cluster *clientcmdapi.Config) error {
	cfg, err := clientcmd.LoadFromFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		cfg, err = clientcmdapi.NewConfig(), nil
	}
	if err != nil {
		return fmt.Errorf("merge into kubeconfig %s: %w", path, err)
	}
	for k, v := range cluster.Clusters {
		cfg.Clusters[k] = v
	}
	for k, v := range cluster.AuthInfos {
		cfg.AuthInfos[k] = v
	}
	for k, v := range cluster.Contexts {
		cfg.Contexts[k] = v
	}
	cfg.CurrentContext = cluster.CurrentContext
	return writeConfig(path, cfg)
}

// unmergeKubeconfig removes the cluster's context from the kubeconfig at
// path, if it is there.
func unmergeKubeconfig(path, name string) error {
	cfg, err := clientcmd.LoadFromFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove context %s from kubeconfig %s: %w", Context(name), path, err)
	}
	ctx := Context(name)
	delete(cfg.Clusters, ctx)
	delete(cfg.AuthInfos, ctx)
	delete(cfg.Contexts, ctx)
	if cfg.CurrentContext == ctx {
		cfg.CurrentContext = ""
	}
	return writeConfig(path, cfg)
}

func writeConfig(path string, cfg *clientcmdapi.Config) error {
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(path, data, 0o600)
}

// Wait waits until the cluster's first server has written its kubeconfig,
// then until every node of the cluster is Ready, or ctx ends. It writes
// the cluster's kubeconfig, merges it into mergeInto if set, and returns
// its path.
func Wait(ctx context.Context, root, name string, timeout time.Duration, mergeInto string) (string, error) {
	dir := filepath.Join(root, name)
	s, err := load(dir)
	if err != nil {
		return "", notFound(name, err)
	}
	// A started or forked cluster's Nodes say Ready from before until
	// their kubelets report again: only a report after now counts.
	since := time.Now().Add(-time.Second)
	ctx, cancel := waitCtx(ctx, timeout)
	defer cancel()
	var cfg *clientcmdapi.Config
	for {
		if cfg, err = writeKubeconfig(dir, s); err == nil {
			break
		}
		if err := sleep(ctx, dir, s, err); err != nil {
			return "", err
		}
	}
	if mergeInto != "" {
		if err := mergeKubeconfig(mergeInto, cfg); err != nil {
			return "", err
		}
		s.MergedInto = append(s.MergedInto, mergeInto)
		l, err := lockWait(dir, time.Minute)
		if err != nil {
			return "", err
		}
		err = save(dir, s)
		l.Close()
		if err != nil {
			return "", err
		}
	}
	if timeout == 0 {
		return paths{dir}.kubeconfig(), nil
	}
	rest, err := clientcmd.NewDefaultClientConfig(*cfg, nil).ClientConfig()
	if err != nil {
		return "", err
	}
	rest.Timeout = 5 * time.Second
	client, err := kubernetes.NewForConfig(rest)
	if err != nil {
		return "", err
	}
	for {
		nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err == nil {
			err = allReady(nodes.Items, len(s.Nodes), since)
		}
		if err == nil {
			return paths{dir}.kubeconfig(), nil
		}
		if err := sleep(ctx, dir, s, err); err != nil {
			return "", err
		}
	}
}

// sleep waits a moment before the next try, or says why waiting is over:
// ctx ended, last being why the cluster was not ready, or a node's kelp
// exited.
func sleep(ctx context.Context, dir string, s *State, last error) error {
	if _, err := os.Stat(paths{dir}.state()); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cluster %s was deleted", s.Name)
	}
	for _, n := range s.Nodes {
		if !n.Kelp.Alive() {
			return fmt.Errorf("kelp on node %s exited: its log %s says why", n.Name, paths{dir}.node(n.Name).log())
		}
	}
	select {
	case <-ctx.Done():
		return fmt.Errorf("cluster %s not ready: %w", s.Name, last)
	case <-time.After(250 * time.Millisecond):
		return nil
	}
}

// allReady says how far nodes are from want Nodes Ready, as their
// kubelets reported after since.
func allReady(nodes []corev1.Node, want int, since time.Time) error {
	ready := 0
	for _, n := range nodes {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && !c.LastHeartbeatTime.Time.Before(since.Truncate(time.Second)) {
				ready++
			}
		}
	}
	if ready < want {
		return fmt.Errorf("%d of %d nodes Ready", ready, want)
	}
	return nil
}
