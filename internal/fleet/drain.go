package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// evictRetry is how often an eviction that a PodDisruptionBudget refuses
// is tried again, and how often the drain looks for the pods to be gone.
const evictRetry = 2 * time.Second

// mirrorAnnotation marks the mirror pod of a static pod, which the
// kubelet keeps whatever the API says.
const mirrorAnnotation = "kubernetes.io/config.mirror"

// cordon marks the node unschedulable, or schedulable again.
func cordon(ctx context.Context, c kubernetes.Interface, node string, unschedulable bool) error {
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"unschedulable": unschedulable}})
	if _, err := c.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		verb := "cordon"
		if !unschedulable {
			verb = "uncordon"
		}
		return fmt.Errorf("%s node %s: %w", verb, node, err)
	}
	return nil
}

// drain evicts the node's pods through the eviction API, which keeps to
// their PodDisruptionBudgets, as kubectl drain does: DaemonSet pods, which
// would come back at once, mirror pods and pods that have ended are left.
// It returns once the pods evicted are gone, or fails after timeout,
// naming the pods left and why.
func drain(ctx context.Context, c kubernetes.Interface, node string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	list, err := c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return fmt.Errorf("list the pods of node %s: %w", node, err)
	}
	left := map[types.UID]string{} // pod → why it is not gone yet
	pods := map[types.UID]corev1.Pod{}
	for _, p := range list.Items {
		if skipDrain(p) {
			continue
		}
		left[p.UID] = "not evicted yet"
		pods[p.UID] = p
	}
	evicted := map[types.UID]bool{}
	for {
		for uid, p := range pods {
			if evicted[uid] {
				continue
			}
			err := c.PolicyV1().Evictions(p.Namespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}})
			switch {
			case err == nil, apierrors.IsNotFound(err):
				evicted[uid] = true
				left[uid] = "evicted, not gone yet"
			case apierrors.IsTooManyRequests(err):
				left[uid] = "its PodDisruptionBudget allows no eviction (" + err.Error() + ")"
			case ctx.Err() == nil:
				left[uid] = "eviction failed: " + err.Error()
			}
		}
		if err := forgetGone(ctx, c, pods, evicted, left); err != nil && ctx.Err() == nil {
			return err
		}
		if len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			var why []string
			for uid, reason := range left {
				why = append(why, fmt.Sprintf("pod %s/%s: %s", pods[uid].Namespace, pods[uid].Name, reason))
			}
			sort.Strings(why)
			return fmt.Errorf("the drain of node %s did not finish within %s: %s", node, timeout, strings.Join(why, "; "))
		case <-time.After(evictRetry):
		}
	}
}

// forgetGone drops the evicted pods that are gone, or replaced by pods of
// the same name.
func forgetGone(ctx context.Context, c kubernetes.Interface, pods map[types.UID]corev1.Pod, evicted map[types.UID]bool, left map[types.UID]string) error {
	for uid := range evicted {
		p := pods[uid]
		got, err := c.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err) || (err == nil && got.UID != uid):
			delete(left, uid)
			delete(pods, uid)
			delete(evicted, uid)
		case err != nil:
			return fmt.Errorf("get pod %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	return nil
}

func skipDrain(p corev1.Pod) bool {
	if _, ok := p.Annotations[mirrorAnnotation]; ok {
		return true
	}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return true
	}
	for _, o := range p.OwnerReferences {
		if o.Controller != nil && *o.Controller && o.Kind == "DaemonSet" {
			return true
		}
	}
	return false
}

// cordonAndDrain cordons the node and drains it; when the drain fails,
// the node is uncordoned again, left as it was found.
func cordonAndDrain(ctx context.Context, c kubernetes.Interface, node string, timeout time.Duration) error {
	if err := cordon(ctx, c, node, true); err != nil {
		return err
	}
	err := drain(ctx, c, node, timeout)
	if err == nil {
		return nil
	}
	if uerr := cordon(context.WithoutCancel(ctx), c, node, false); uerr != nil {
		return fmt.Errorf("%w; and it stays cordoned: %v", err, uerr)
	}
	return fmt.Errorf("%w; the node is uncordoned", err)
}
