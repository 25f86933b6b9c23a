package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/bootguard"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/version"
)

var nodeLog = logrus.WithField("component", "upgrade-executor")

// reportPoll is how often the executor looks whether the kelp it runs is
// still on trial with the boot guard, and whether its Node is there.
const reportPoll = 2 * time.Second

// Executor upgrades the kelp of one node when its Node asks, under the
// node's own identity: it reads Upgrades and changes only its own Node's
// ReportPrefix annotations.
type Executor struct {
	NodeName string
	DataDir  string
	// Binary is the running kelp's file, where the new one goes.
	Binary  string
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// NoRollback is a node whose boot guard never rolls back
	// (--upgrade-attempts 0, as kelp cluster's nodes, which share the
	// machine's kelp): it refuses upgrades, which would have no way back.
	NoRollback bool
}

// pending is what a node records before it swaps its kelp, for its next
// start to report.
type pending struct {
	Request string    `json:"request"`
	SHA256  string    `json:"sha256"`
	At      time.Time `json:"at"`
}

// Run reports on the Node what became of the last upgrade, then carries
// out the upgrades the Node is asked for until ctx ends. One that swapped
// the binary returns a *RestartError.
func (e Executor) Run(ctx context.Context) error {
	if err := e.report(ctx); err != nil {
		return err
	}
	requests := make(chan string, 1)
	lw := cache.NewListWatchFromClient(e.Client.CoreV1().RESTClient(), "nodes", metav1.NamespaceAll, fields.OneTermEqualSelector("metadata.name", e.NodeName))
	offer := func(obj any) {
		n, ok := obj.(*corev1.Node)
		if !ok {
			return
		}
		req := n.Annotations[RequestAnnotation]
		if res, ok := ParseResult(n.Annotations[ResultAnnotation]); req == "" || (ok && res.Request == req) {
			return
		}
		select {
		case requests <- req:
		default:
		}
	}
	_, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.Node{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    offer,
			UpdateFunc: func(_, obj any) { offer(obj) },
		},
	})
	go informer.Run(ctx.Done())
	for {
		select {
		case <-ctx.Done():
			return nil
		case req := <-requests:
			err := e.upgrade(ctx, req)
			var restart *RestartError
			if errors.As(err, &restart) {
				return err
			}
			if ctx.Err() != nil {
				return nil
			}
			nodeLog.WithError(err).WithField("upgrade", req).Error("The upgrade of this node failed; it runs this kelp still")
			if err := e.annotate(ctx, map[string]string{ResultAnnotation: Result{Request: req, Running: running(), Message: err.Error()}.String()}); err != nil {
				nodeLog.WithError(err).Warn("The upgrade's failure cannot be reported on the Node")
			}
		}
	}
}

// running names this kelp.
func running() string {
	v := version.Current()
	return fmt.Sprintf("kelp %s (Kubernetes %s)", v.Kelp, v.Kubernetes)
}

// upgrade carries out the request req (RequestAnnotation): fetch and
// check the new kelp, put it in place keeping kelp.previous, and return
// a *RestartError. A failure leaves the running kelp in place.
func (e Executor) upgrade(ctx context.Context, req string) error {
	name, sum, ok := strings.Cut(req, "/")
	if !ok {
		return fmt.Errorf("the Node's %s annotation %q is not <upgrade>/<sha256>", RequestAnnotation, req)
	}
	obj, err := e.Dynamic.Resource(Resource).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get Upgrade %s: %w", name, err)
	}
	u, err := fromUnstructured(obj)
	if err != nil {
		return err
	}
	if u.Request() != req {
		return fmt.Errorf("Upgrade %s asks for sha256 %s now, not %s: create a new Upgrade to change the binary", name, u.Spec.SHA256, sum)
	}
	spec, err := u.Spec.Validate()
	if err != nil {
		return err
	}
	nodeLog.WithFields(logrus.Fields{"upgrade": name, "from": source(spec)}).Info("Upgrading this node's kelp")
	return e.apply(ctx, req, spec)
}

// apply puts the kelp of spec in place of e.Binary.
func (e Executor) apply(ctx context.Context, req string, spec Spec) error {
	if e.NoRollback {
		return fmt.Errorf("this node runs with --upgrade-attempts 0, so its boot guard would never roll a failed upgrade back (kelp cluster's nodes share the machine's kelp): upgrade it by hand, or run it with --upgrade-attempts 3")
	}
	previous, target := bootguard.Paths(e.Binary)
	if target != e.Binary {
		return fmt.Errorf("this node runs %s, the kelp a rollback keeps: install kelp again before an upgrade", e.Binary)
	}
	got, err := fetch(ctx, spec, layout.Agent(e.DataDir).Upgrades, filepath.Dir(target))
	if err != nil {
		return err
	}
	if err := checkNotOlder(got.Kubernetes, version.Current().Kubernetes); err != nil {
		os.Remove(got.Path)
		return err
	}
	if err := e.swap(req, spec, got.Path, previous, target); err != nil {
		os.Remove(got.Path)
		return err
	}
	nodeLog.WithFields(logrus.Fields{"new": got.Kelp, "previous": previous}).Info("The new kelp is in place; restarting into it")
	return &RestartError{Binary: target, Request: req}
}

// swap records the upgrade as pending, keeps the running kelp as
// previous (a link, so that target is never missing) and renames fresh
// into target.
func (e Executor) swap(req string, spec Spec, fresh, previous, target string) error {
	record, err := json.Marshal(pending{Request: req, SHA256: strings.ToLower(spec.SHA256), At: time.Now().UTC()})
	if err != nil {
		return err
	}
	path := layout.Agent(e.DataDir).UpgradePending
	if err := atomicfile.Write(path, record, 0o600); err != nil {
		return err
	}
	link := previous + ".new"
	os.Remove(link)
	err = os.Link(target, link)
	if err == nil {
		err = os.Rename(link, previous)
	}
	if err == nil {
		err = os.Rename(fresh, target)
	}
	if err == nil {
		err = atomicfile.SyncDir(filepath.Dir(target))
	}
	if err != nil {
		os.Remove(link)
		os.Remove(path)
		return fmt.Errorf("put the new kelp in place of %s: %w; the running kelp stays", target, err)
	}
	return nil
}

// report waits until the running kelp is no longer on trial (it became
// ready: the boot guard keeps it), then says on the Node which kelp runs
// and, after an upgrade, whether it is the one asked for.
func (e Executor) report(ctx context.Context) error {
	path := layout.Agent(e.DataDir).UpgradePending
	var p pending
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		data = nil
	case err != nil:
		return fmt.Errorf("read %s: %w", path, err)
	case json.Unmarshal(data, &p) != nil:
		nodeLog.Warnf("%s cannot be read: the last upgrade of this node is not reported", path)
		data = nil
	}
	for {
		trial, err := bootguard.OnTrial(e.DataDir)
		if err != nil {
			return err
		}
		if !trial {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(reportPoll):
		}
	}
	annotations := map[string]string{VersionAnnotation: running()}
	if data != nil {
		res, err := e.result(p)
		if err != nil {
			return err
		}
		annotations[ResultAnnotation] = res.String()
	}
	for {
		err := e.annotate(ctx, annotations)
		if err == nil {
			break
		}
		if !apierrors.IsNotFound(err) {
			nodeLog.WithError(err).Debug("report on the Node")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(reportPoll):
		}
	}
	if data != nil {
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("remove %s: %w", path, err)
		}
	}
	return nil
}

// result says whether the kelp that runs is the one the pending upgrade
// p put in place, and if not, why.
func (e Executor) result(p pending) (Result, error) {
	sum, err := fileSHA256(e.Binary)
	if err != nil {
		return Result{}, fmt.Errorf("check this kelp's sha256: %w", err)
	}
	res := Result{Request: p.Request, Running: running(), OK: sum == p.SHA256}
	if res.OK {
		res.Message = "runs " + res.Running
		return res, nil
	}
	res.Message = "the node runs its earlier kelp again, " + res.Running
	if rb, err := bootguard.LastRollback(e.DataDir); err == nil && rb != nil && !rb.At.Before(p.At) {
		res.Message = "the node's boot guard " + rb.String()
	}
	nodeLog.WithField("upgrade", p.Request).Warn("The upgrade of this node did not last: " + res.Message)
	return res, nil
}

// annotate sets annotations on the node's own Node.
func (e Executor) annotate(ctx context.Context, annotations map[string]string) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	_, err := e.Client.CoreV1().Nodes().Patch(ctx, e.NodeName, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}
