package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"

	"github.com/kelp-dev/kelp/internal/crd"
	"github.com/kelp-dev/kelp/internal/joinapi"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/leader"
	"github.com/kelp-dev/kelp/internal/reconcile"
	"github.com/kelp-dev/kelp/internal/version"
)

var log = logrus.WithField("component", "upgrade-controller")

const (
	// leaseName is the Lease the servers take turns by: one writer of
	// the Upgrades' status.
	leaseName = "kelp-upgrade-controller"
	// syncEvery is how often the controller looks at the rollout under
	// way; with none, it looks at its informer's cache only.
	syncEvery = 2 * time.Second
	// nodePoll is how often a node's worker looks at its Node.
	nodePoll = 2 * time.Second
	// conditionReady is the type of an Upgrade's one condition.
	conditionReady = "Ready"
)

// Config is what the controller needs.
type Config struct {
	// Kube, Dynamic and Extensions are the admin's clients: the
	// controller drains any node.
	Kube       kubernetes.Interface
	Dynamic    dynamic.Interface
	Extensions apiextensionsclient.Interface
	// LeaderElection makes the servers that share a datastore take turns.
	LeaderElection bool
	// Self is this server's node, upgraded last of the servers; "" when
	// it runs none.
	Self string
	// DataDir is this server's: a spec.path is in its upgrades directory.
	DataDir string
	// StageDir is where the new kelp is checked before any node is
	// touched: beside the running kelp, where each node puts it too, and
	// not in the data dir, whose disk the datastore needs.
	StageDir string
}

type controller struct {
	cfg     Config
	client  kubernetes.Interface
	dynamic dynamic.Interface
	store   cache.Store

	mu sync.Mutex
	// workers are the nodes being upgraded, by node name.
	workers map[string]bool
}

// Run applies the Upgrade CRD, then carries out Upgrades until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if err := crd.Retry(ctx, "install the Upgrade CRD", func(ctx context.Context) error { return EnsureCRD(ctx, cfg.Extensions) }); err != nil {
		return err
	}
	c := &controller{cfg: cfg, client: cfg.Kube, dynamic: cfg.Dynamic, workers: map[string]bool{}}
	if !cfg.LeaderElection {
		return c.run(ctx)
	}
	return leader.Run(ctx, cfg.Kube, leaseName, "upgrades the nodes of Upgrades", c.run)
}

func (c *controller) run(ctx context.Context) error {
	informer := dynamicinformer.NewFilteredDynamicInformer(c.dynamic, Resource, metav1.NamespaceAll, 0, cache.Indexers{}, nil).Informer()
	c.store = informer.GetStore()
	return reconcile.Loop{
		Informers: map[string]cache.SharedIndexInformer{"upgrades": informer},
		// A rollout follows its nodes by polling, on the tick; with none,
		// a tick does nothing.
		Resync: syncEvery,
		Sync: func(ctx context.Context, resync bool) error {
			if resync && !c.rolling() {
				return nil
			}
			if err := c.sync(ctx); err != nil && ctx.Err() == nil {
				log.WithError(err).Warn("Upgrades: trying again")
			}
			return nil
		},
	}.Run(ctx)
}

// rolling says whether an Upgrade is not done yet.
func (c *controller) rolling() bool {
	return slices.ContainsFunc(c.upgrades(), func(u *Upgrade) bool { return !done(u.Status.Phase) })
}

// upgrades are the Upgrades in the cache, the oldest first.
func (c *controller) upgrades() []*Upgrade {
	var out []*Upgrade
	for _, item := range c.store.List() {
		u, err := fromUnstructured(item.(*unstructured.Unstructured))
		if err != nil {
			log.WithError(err).Warn("an Upgrade cannot be read")
			continue
		}
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b *Upgrade) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

func done(phase string) bool { return phase == PhaseSucceeded || phase == PhaseFailed }

// sync works on the oldest Upgrade not done; the others wait for it.
func (c *controller) sync(ctx context.Context) error {
	var active *Upgrade
	for _, u := range c.upgrades() {
		switch {
		case done(u.Status.Phase):
		case active == nil:
			active = u
		default:
			msg := fmt.Sprintf("waits for Upgrade %s to finish: one rollout at a time", active.Name)
			if cond := meta.FindStatusCondition(u.Status.Conditions, conditionReady); cond == nil || cond.Message != msg {
				if err := c.update(ctx, u.Name, func(s *Status) bool {
					if s.Phase != "" && s.Phase != PhasePending {
						return false
					}
					s.Phase = PhasePending
					setCondition(s, false, "Waiting", msg)
					return true
				}); err != nil {
					return err
				}
			}
		}
	}
	switch {
	case active == nil:
		return nil
	case active.Status.Phase == PhaseUpgrading:
		return c.step(ctx, active)
	}
	return c.begin(ctx, active)
}

// begin checks an Upgrade before any node is touched, and plans it.
func (c *controller) begin(ctx context.Context, u *Upgrade) error {
	plan, target, refusal := c.check(ctx, u)
	if refusal != "" {
		log.WithField("upgrade", u.Name).Warn("Refused: " + refusal)
		return c.update(ctx, u.Name, func(s *Status) bool {
			s.Phase = PhaseFailed
			setCondition(s, false, "Refused", refusal+"; no node was touched")
			return true
		})
	}
	log.WithFields(logrus.Fields{"upgrade": u.Name, "to": target, "nodes": len(plan)}).Info("Upgrading the cluster's nodes: servers one at a time, then agents")
	return c.update(ctx, u.Name, func(s *Status) bool {
		if s.Phase == PhaseUpgrading {
			return false
		}
		s.Phase, s.Target, s.Nodes = PhaseUpgrading, target, plan
		setCondition(s, false, PhaseUpgrading, fmt.Sprintf("upgrading %d nodes to %s", len(plan), target))
		return true
	})
}

// check refuses an Upgrade that must not start, and plans one that may:
// the spec is valid, the new kelp is had and checked here as every node
// will, and its Kubernetes is no older than the cluster's.
func (c *controller) check(ctx context.Context, u *Upgrade) (plan []NodeStatus, target, refusal string) {
	spec, err := u.Spec.Validate()
	if err != nil {
		return nil, "", err.Error()
	}
	got, err := fetch(ctx, spec, layout.Agent(c.cfg.DataDir).Upgrades, c.cfg.StageDir)
	if err != nil {
		return nil, "", "on server " + c.name() + ": " + err.Error()
	}
	os.Remove(got.Path)
	nodes, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, "", err.Error()
	}
	servers, err := joinapi.ServerNodes(ctx, c.client)
	if err != nil {
		return nil, "", err.Error()
	}
	cluster := version.Current().Kubernetes
	for _, n := range nodes.Items {
		if kv := n.Status.NodeInfo.KubeletVersion; cluster == "" || version.NewerMinor(kv, cluster) {
			cluster = kv
		}
		from := n.Annotations[VersionAnnotation]
		if from == "" {
			from = "Kubernetes " + n.Status.NodeInfo.KubeletVersion
		}
		plan = append(plan, NodeStatus{Name: n.Name, Server: servers[n.Name], State: StatePending, FromVersion: from})
	}
	if err := checkNotOlder(got.Kubernetes, cluster); err != nil {
		return nil, "", err.Error()
	}
	if len(plan) == 0 {
		return nil, "", "the cluster has no nodes to upgrade"
	}
	return order(plan, c.cfg.Self), fmt.Sprintf("%s (Kubernetes %s)", strings.TrimPrefix(got.Kelp, "kelp "), got.Kubernetes), ""
}

func (c *controller) name() string {
	if c.cfg.Self != "" {
		return c.cfg.Self
	}
	h, _ := os.Hostname()
	return h
}

// step starts the nodes whose turn it is, and ends the rollout when they
// are all done or one failed.
func (c *controller) step(ctx context.Context, cached *Upgrade) error {
	// The cache may not have the workers' last writes yet.
	obj, err := c.dynamic.Resource(Resource).Get(ctx, cached.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	u, err := fromUnstructured(obj)
	if err != nil {
		return err
	}
	spec, err := u.Spec.Validate()
	if err != nil {
		return err
	}
	// Nodes under way without a worker: this server took over the
	// rollout (it restarted, or leads now).
	for _, n := range u.Status.Nodes {
		if inFlight(n.State) {
			c.work(ctx, u, spec, n.Name)
		}
	}
	start, phase := next(u.Status.Nodes, spec.Concurrency)
	return c.update(ctx, u.Name, func(s *Status) bool {
		changed := false
		for _, name := range start {
			if n := s.node(name); n != nil && n.State == StatePending {
				n.State, n.Message, n.Since = StateDraining, "cordoned, draining", now()
				changed = true
			}
		}
		if phase != s.Phase {
			s.Phase = phase
			switch phase {
			case PhaseSucceeded:
				setCondition(s, true, PhaseSucceeded, fmt.Sprintf("all %d nodes run %s", len(s.Nodes), s.Target))
			case PhaseFailed:
				setCondition(s, false, PhaseFailed, failure(*s))
			}
			changed = true
		}
		return changed
	})
}

// failure says plainly which node failed and why, and what became of
// the others.
func failure(s Status) string {
	var failed, upgraded, untouched []string
	for _, n := range s.Nodes {
		switch n.State {
		case StateFailed:
			failed = append(failed, fmt.Sprintf("node %s: %s", n.Name, n.Message))
		case StateSucceeded:
			upgraded = append(upgraded, n.Name)
		case StatePending:
			untouched = append(untouched, n.Name)
		}
	}
	msg := "the rollout stopped: " + strings.Join(failed, "; ")
	if len(upgraded) > 0 {
		msg += "; upgraded and kept: " + strings.Join(upgraded, ", ")
	}
	if len(untouched) > 0 {
		msg += "; not touched: " + strings.Join(untouched, ", ")
	}
	return msg
}

func now() *metav1.Time { t := metav1.Now(); return &t }

func setCondition(s *Status, ready bool, reason, message string) {
	status := metav1.ConditionFalse
	if ready {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: conditionReady, Status: status, Reason: reason, Message: message})
}

// update changes the status of the Upgrade name by change, which says
// whether it changed anything, against the latest object.
func (c *controller) update(ctx context.Context, name string, change func(*Status) bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		obj, err := c.dynamic.Resource(Resource).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		u, err := fromUnstructured(obj)
		if err != nil {
			return err
		}
		if !change(&u.Status) {
			return nil
		}
		next, err := toUnstructured(u)
		if err != nil {
			return err
		}
		_, err = c.dynamic.Resource(Resource).UpdateStatus(ctx, next, metav1.UpdateOptions{})
		return err
	})
}

// setNode changes the status of one node of the Upgrade name.
func (c *controller) setNode(ctx context.Context, name, node string, change func(*NodeStatus)) error {
	return c.update(ctx, name, func(s *Status) bool {
		n := s.node(node)
		if n == nil {
			return false
		}
		change(n)
		return true
	})
}

// work starts the worker of node, unless it has one.
func (c *controller) work(ctx context.Context, u *Upgrade, spec Spec, node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.workers[node] {
		return
	}
	c.workers[node] = true
	go func() {
		defer func() {
			c.mu.Lock()
			delete(c.workers, node)
			c.mu.Unlock()
		}()
		l := log.WithFields(logrus.Fields{"upgrade": u.Name, "node": node})
		state, msg, to := c.upgradeNode(ctx, u, spec, node)
		if ctx.Err() != nil {
			return
		}
		if state == StateFailed {
			l.Error("The upgrade of the node failed: " + msg)
		} else {
			l.Info("The node runs the new kelp")
		}
		if err := c.setNode(ctx, u.Name, node, func(n *NodeStatus) {
			n.State, n.Message, n.Since = state, msg, now()
			if to != "" {
				n.ToVersion = to
			}
		}); err != nil && ctx.Err() == nil {
			l.WithError(err).Warn("the node's state is not recorded; it is taken up again")
		}
	}()
}

// upgradeNode takes the node through its upgrade from where its status
// says it is, and returns its end state, the message, and the kelp it
// runs after it.
func (c *controller) upgradeNode(ctx context.Context, u *Upgrade, spec Spec, node string) (state, message, to string) {
	ns := u.Status.node(node)
	if ns.State == StateDraining {
		if err := cordonAndDrain(ctx, c.client, node, spec.drainTimeout()); err != nil {
			return StateFailed, err.Error(), ""
		}
		if err := c.setNode(ctx, u.Name, node, func(n *NodeStatus) {
			n.State, n.Message, n.Since = StateUpgrading, "drained; asked to run the new kelp", now()
		}); err != nil {
			return StateFailed, err.Error(), ""
		}
		ns = &NodeStatus{State: StateUpgrading, Since: now()}
	}
	req := u.Request()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{RequestAnnotation: req}}})
	if err := retryAPI(ctx, func() error {
		_, err := c.client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	}); err != nil {
		return StateFailed, fmt.Sprintf("ask the node to upgrade: %v", err), ""
	}
	deadline := time.Now().Add(spec.nodeTimeout())
	if ns.Since != nil {
		deadline = ns.Since.Add(spec.nodeTimeout())
	}
	for {
		n, err := c.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err == nil {
			if res, ok := ParseResult(n.Annotations[ResultAnnotation]); ok && res.Request == req {
				if !res.OK {
					if err := cordon(ctx, c.client, node, false); err != nil {
						return StateFailed, res.Message + "; " + err.Error(), res.Running
					}
					return StateFailed, res.Message + "; the node is uncordoned", res.Running
				}
				if nodeReady(n) {
					if err := cordon(ctx, c.client, node, false); err != nil {
						return StateFailed, "the node runs the new kelp, but " + err.Error(), res.Running
					}
					return StateSucceeded, res.Message, res.Running
				}
			}
		}
		if time.Now().After(deadline) {
			return StateFailed, fmt.Sprintf("the node did not report running the new kelp within %s (spec.nodeTimeout); it stays cordoned: look at its kelp's log (journalctl -u kelp)", spec.nodeTimeout()), ""
		}
		select {
		case <-ctx.Done():
			return "", "", ""
		case <-time.After(nodePoll):
		}
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// retryAPI retries fn for a minute while the apiserver does not answer.
func retryAPI(ctx context.Context, fn func() error) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, nodePoll, time.Minute, true, func(context.Context) (bool, error) {
		last = fn()
		if last != nil && (apierrors.IsNotFound(last) || apierrors.IsForbidden(last) || apierrors.IsInvalid(last)) {
			return false, last
		}
		return last == nil, nil
	})
	if last != nil {
		return last
	}
	return err
}
