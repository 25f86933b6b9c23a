package server_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

// TestCSIDriverAfterLeading restarts a server on embedded etcd while
// "another server" leads: the test renews the first run's controller-
// manager lease until the restarted kubelet runs, then releases it. The
// restarted controller-manager then leads, and builds its controllers,
// after the kubelet initialized its volume plugins, as on a server that
// takes over from one that went away.
func TestCSIDriverAfterLeading(t *testing.T) {
	t.Parallel()
	n := testcluster.NewNode(t)
	n.Agent = true
	n.Start("--cluster-init")
	n.WaitReady(startTimeout)
	const lease = "kube-controller-manager"
	holder := leaseHolders(t, n)[lease]
	ctx, stopHolding := context.WithCancel(context.Background())
	held := holdLease(ctx, n, lease, holder)
	t.Logf("stopped in %s", n.Stop())
	n.Start("--cluster-init")
	n.WaitReady(startTimeout)
	n.WaitLog("kelp node is running", startTimeout)
	if now := leaseHolder(n.Client(), lease); now != holder {
		t.Fatalf("the controller-manager lease is held by %q, not the test's %q: the test needs the restarted server to lead only later", now, holder)
	}
	stopHolding()
	<-held
	must(t, "release the controller-manager lease", func() error {
		l, err := n.Client().CoordinationV1().Leases("kube-system").Get(context.Background(), lease, metav1.GetOptions{})
		if err != nil {
			return err
		}
		l.Spec.HolderIdentity = nil
		_, err = n.Client().CoordinationV1().Leases("kube-system").Update(context.Background(), l, metav1.UpdateOptions{})
		return err
	})
	testcluster.Eventually(t, "the restarted controller-manager leads", func() (bool, error) {
		now := leaseHolder(n.Client(), lease)
		return now != "" && now != holder, nil
	})
	csiDriverRegisters(t, n)
	n.Stop()
}

// holdLease renews the kube-system lease name under holder every second,
// as a live leader would, until ctx ends; the channel closes then. Errors,
// e.g. while the server restarts, are tried again.
func holdLease(ctx context.Context, n *testcluster.Node, name, holder string) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		leases := n.Client().CoordinationV1().Leases("kube-system")
		for ctx.Err() == nil {
			if l, err := leases.Get(ctx, name, metav1.GetOptions{}); err == nil {
				l.Spec.HolderIdentity = &holder
				l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
				_, _ = leases.Update(ctx, l, metav1.UpdateOptions{})
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	return done
}

// csiDriverRegisters checks that a CSI driver can register with the
// server's kubelet after the server's controller-manager, which started
// leading after the kubelet started, has built its controllers: they
// initialize upstream's CSI volume plugin with no node, and the kubelet's
// plugin keeps its node in the same package variable.
func csiDriverRegisters(t *testing.T, n *testcluster.Node) {
	t.Helper()
	controllersBuilt(t, n)

	const driver = "csi.test.kelp.io"
	var out bytes.Buffer
	cmd := n.Command(testcluster.BuildCommand(t, "csidriver"), driver, layout.KubeletRoot, n.Name)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()

	c := n.Client()
	err := wait.PollUntilContextTimeout(context.Background(), time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		csiNode, err := c.StorageV1().CSINodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, d := range csiNode.Spec.Drivers {
			if d.Name == driver && d.NodeID == n.Name {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		var seen []string
		for _, line := range strings.Split(n.Log(), "\n") {
			if strings.Contains(line, driver) || strings.Contains(line, "CSINode") {
				seen = append(seen, line)
			}
		}
		t.Fatalf("CSI driver %s did not register with the kubelet of %s\nthe driver:\n%s\nkelp:\n%s", driver, n.Name, out.String(), tail(strings.Join(seen, "\n")))
	}
}

// controllersBuilt waits until the node's controller-manager lists the
// check of the controller it builds first in its verbose /healthz: it
// registers them all at once, after building every controller.
func controllersBuilt(t *testing.T, n *testcluster.Node) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext:     n.DialContext,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // self-signed, loopback
	}}
	const check = "[+]serviceaccount-token-controller ok"
	testcluster.Eventually(t, "the controller-manager lists "+check, func() (bool, error) {
		resp, err := client.Get("https://127.0.0.1:10257/healthz?verbose") // the controller-manager's secure port
		if err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return err == nil && slices.Contains(strings.Split(string(body), "\n"), check), nil
	})
}
