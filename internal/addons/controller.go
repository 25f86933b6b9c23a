package addons

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/kelp-dev/kelp/internal/apply"
	"github.com/kelp-dev/kelp/internal/crd"
)

var log = logrus.WithField("component", "manifests")

// Event and condition reasons.
const (
	reasonApplied      = "Applied"
	reasonApplyFailed  = "ApplyFailed"
	reasonRemoveFailed = "RemoveFailed"
)

// Controller applies one manifests directory.
type Controller struct {
	dir     string
	dynamic dynamic.Interface
	core    kubernetes.Interface
	crds    apiextensionsclient.Interface
	mapper  *restmapper.DeferredDiscoveryRESTMapper
	// reported is the failure last logged per file, so that a failure
	// that every retry meets again is logged once.
	reported map[string]string
}

// Clients are the admin's clients a Controller applies manifests with:
// a manifest may hold anything.
type Clients struct {
	Kube       kubernetes.Interface
	Dynamic    dynamic.Interface
	Extensions apiextensionsclient.Interface
}

// New makes the Controller of the manifests directory dir.
func New(c Clients, dir string) *Controller {
	return &Controller{
		dir:      filepath.Clean(dir),
		dynamic:  c.Dynamic,
		core:     c.Kube,
		crds:     c.Extensions,
		mapper:   restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.Kube.Discovery())),
		reported: map[string]string{},
	}
}

// Start applies the Addon CustomResourceDefinition, then every manifest
// of the directory, unchanged ones too (which undoes edits made in the
// cluster meanwhile, and costs no writes where there were none), and
// removes the objects of manifests that are gone. A manifest that fails
// is reported, not returned: Start fails only when the Addons or the
// directory cannot be read or written.
func (c *Controller) Start(ctx context.Context) error {
	if err := crd.Retry(ctx, "install the Addon CRD", func(ctx context.Context) error { return ensureCRD(ctx, c.crds) }); err != nil {
		return err
	}
	_, err := c.sync(ctx, true)
	return err
}

// manifest is one file of the directory during a pass.
type manifest struct {
	file, path, name string
	addon            *Addon // its Addon; nil until there is one
	sum              string
	objs             []*unstructured.Unstructured
	// unusable is why the file cannot be applied at all: it cannot be
	// read or parsed. Nothing is retried until the file changes.
	unusable error
	applied  []Ref
	failed   []error
}

// pass is what one pass over the directory learns about the cluster.
type pass struct {
	// crds are the CustomResourceDefinitions applied in this pass, by the
	// kind they define; waitedFor holds those mapping waited for.
	crds      map[schema.GroupKind]string
	waitedFor map[string]bool
	// fresh says that discovery was reset since the last
	// CustomResourceDefinition was applied: a kind it does not know now
	// is not served.
	fresh bool
}

// sync is one pass over the directory: the manifests that changed (with
// force: all) are applied, and those that are gone removed. It says
// whether a manifest waits for something a retry may bring (a kind not
// served yet, a request the apiserver refused); it returns an error only
// when the Addons or the directory cannot be read.
func (c *Controller) sync(ctx context.Context, force bool) (retry bool, err error) {
	files, skipped, err := c.readDir()
	if err != nil {
		return false, err
	}
	addons, err := c.listAddons(ctx)
	if err != nil {
		return false, err
	}
	var todo []*manifest
	names := map[string]bool{}
	for _, file := range files {
		name := addonName(file)
		if names[name] {
			c.reportFile(file, fmt.Errorf("%s: another file of the same name without extension is applied as the Addon %s already: rename one of them", filepath.Join(c.dir, file), name), logrus.ErrorLevel)
			continue
		}
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			c.reportFile(file, fmt.Errorf("%s: %q cannot name its Addon (%s): rename the file", filepath.Join(c.dir, file), name, strings.Join(errs, "; ")), logrus.ErrorLevel)
			continue
		}
		names[name] = true
		m := &manifest{file: file, path: filepath.Join(c.dir, file), name: name, addon: addons[name]}
		data, err := os.ReadFile(m.path)
		if err != nil {
			m.unusable = fmt.Errorf("read the manifest: %w", err)
			todo = append(todo, m)
			continue
		}
		m.sum = checksum(data)
		if !force && m.addon != nil && m.addon.Spec.Checksum == m.sum && m.addon.Spec.Source == m.path {
			continue
		}
		if m.objs, err = parse(data); err != nil {
			m.unusable = fmt.Errorf("%s: %w: fix the file", m.path, err)
		}
		applyOrder(m.objs)
		todo = append(todo, m)
	}

	// Namespaces and CustomResourceDefinitions of every manifest first:
	// an object may need one from another file.
	p := &pass{crds: map[schema.GroupKind]string{}, waitedFor: map[string]bool{}}
	for _, first := range []bool{true, false} {
		for _, m := range todo {
			c.applyObjects(ctx, p, m, first)
		}
	}
	if err := ctx.Err(); err != nil {
		return false, err // stopping: what failed meanwhile is no failure of the files
	}
	for _, m := range todo {
		kept := recordedElsewhere(addons, m.name)
		for _, other := range todo {
			if other != m {
				kept = append(kept, other.applied...)
			}
		}
		if c.finish(ctx, p, m, kept) {
			retry = true
		}
		if m.addon != nil {
			addons[m.name] = m.addon
		}
	}
	for _, name := range slices.Sorted(maps.Keys(addons)) {
		a := addons[name]
		if names[name] || filepath.Dir(a.Spec.Source) != c.dir || skipped[filepath.Base(a.Spec.Source)] {
			continue
		}
		if c.remove(ctx, p, a, recordedElsewhere(addons, name)) {
			delete(addons, name)
		} else {
			retry = true
		}
	}
	c.forget(files, addons)
	return retry, nil
}

// forget drops the failures logged of files that are gone and have no
// Addon left to remove, so that a file of the same name is logged anew.
func (c *Controller) forget(files []string, addons map[string]*Addon) {
	known := map[string]bool{}
	for _, f := range files {
		known[f] = true
	}
	for _, a := range addons {
		known[filepath.Base(a.Spec.Source)] = true
	}
	for file := range c.reported {
		if !known[file] {
			delete(c.reported, file)
		}
	}
}

// readDir lists the manifests of the directory, without those a .skip
// file disables, and the names of the disabled ones.
func (c *Controller) readDir() (files []string, skipped map[string]bool, err error) {
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return nil, nil, fmt.Errorf("read the manifests directory: %w", err)
	}
	skipped = map[string]bool{}
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), SkipSuffix); ok {
			skipped[name] = true
		}
	}
	for _, e := range entries {
		if !isManifest(e.Name()) || skipped[e.Name()] {
			continue
		}
		// Stat, not the entry's type: a link to a file is a manifest too.
		if info, err := os.Stat(filepath.Join(c.dir, e.Name())); err != nil || !info.Mode().IsRegular() {
			continue
		}
		files = append(files, e.Name())
	}
	return files, skipped, nil
}

func (c *Controller) listAddons(ctx context.Context) (map[string]*Addon, error) {
	list, err := c.dynamic.Resource(addonResource).Namespace(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the Addons in %s: %w", Namespace, err)
	}
	addons := map[string]*Addon{}
	for i := range list.Items {
		a, err := toAddon(&list.Items[i])
		if err != nil {
			return nil, err
		}
		addons[a.Name] = a
	}
	return addons, nil
}

func toAddon(u *unstructured.Unstructured) (*Addon, error) {
	var a Addon
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &a); err != nil {
		return nil, fmt.Errorf("read the Addon %s: %w", u.GetName(), err)
	}
	return &a, nil
}

// recordedElsewhere are the objects the Addons other than name list.
func recordedElsewhere(addons map[string]*Addon, name string) []Ref {
	var refs []Ref
	for other, a := range addons {
		if other != name {
			refs = append(refs, a.Status.Objects...)
		}
	}
	return refs
}

// applyObjects applies m's Namespaces and CustomResourceDefinitions
// (first) or its other objects.
func (c *Controller) applyObjects(ctx context.Context, p *pass, m *manifest, first bool) {
	if m.unusable != nil {
		return
	}
	for _, u := range m.objs {
		if first != appliedFirst(u) {
			continue
		}
		ref, err := c.applyObject(ctx, p, u)
		if err != nil {
			m.failed = append(m.failed, err)
			continue
		}
		m.applied = append(m.applied, ref)
	}
}

func (c *Controller) applyObject(ctx context.Context, p *pass, u *unstructured.Unstructured) (Ref, error) {
	gvk := u.GroupVersionKind()
	mapping, err := c.mapping(ctx, p, gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		return Ref{}, fmt.Errorf("%s: the apiserver does not serve the kind %s in %s (yet): is its CustomResourceDefinition applied? kelp retries", refOf(u), gvk.Kind, gvk.GroupVersion())
	} else if err != nil {
		return Ref{}, fmt.Errorf("%s: %w", refOf(u), err)
	}
	if mapping.Scope.Name() != meta.RESTScopeNameNamespace {
		u.SetNamespace("")
	} else if u.GetNamespace() == "" {
		u.SetNamespace(metav1.NamespaceDefault)
	}
	if _, err := c.dynamic.Resource(mapping.Resource).Namespace(u.GetNamespace()).Apply(ctx, u.GetName(), u, apply.Options()); err != nil {
		return Ref{}, fmt.Errorf("apply %s: %w", refOf(u), err)
	}
	if gvk.GroupKind() == crdKind {
		group, _, _ := unstructured.NestedString(u.Object, "spec", "group")
		kind, _, _ := unstructured.NestedString(u.Object, "spec", "names", "kind")
		p.crds[schema.GroupKind{Group: group, Kind: kind}] = u.GetName()
		p.fresh = false
	}
	return refOf(u), nil
}

// mapping finds the resource of a kind. Discovery is cached and reset
// when a kind is missing from it, at most once after each
// CustomResourceDefinition applied; for a kind defined by one applied in
// this pass, mapping first waits for it to be established.
func (c *Controller) mapping(ctx context.Context, p *pass, gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	m, err := c.mapper.RESTMapping(gk, versions...)
	if !meta.IsNoMatchError(err) {
		return m, err
	}
	deadline := time.Now()
	if name, ok := p.crds[gk]; ok && !p.waitedFor[name] {
		p.waitedFor[name] = true
		if err := crd.WaitEstablished(ctx, c.crds, name, 10*time.Second); err != nil {
			log.WithError(err).Debug("wait for a CustomResourceDefinition of a manifest")
		}
		// Discovery serves an established kind a moment later.
		p.fresh = false
		deadline = time.Now().Add(5 * time.Second)
	}
	for {
		if !p.fresh {
			c.mapper.Reset()
			p.fresh = true
			if m, err = c.mapper.RESTMapping(gk, versions...); !meta.IsNoMatchError(err) {
				return m, err
			}
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(500 * time.Millisecond):
		}
		p.fresh = false
	}
}

// finish records what applying m did in its Addon: prunes what left the
// file once all of it applied, updates the status and the checksum, and
// reports a failure. kept are the objects other manifests apply, which
// pruning leaves. It says whether m is worth a retry.
func (c *Controller) finish(ctx context.Context, p *pass, m *manifest, kept []Ref) (retry bool) {
	flog := log.WithField("file", m.path)
	if m.addon == nil || m.addon.Spec.Source != m.path {
		var recorded string
		if m.addon != nil {
			recorded = m.addon.Spec.Checksum
		}
		a, err := c.applySpec(ctx, m.name, m.path, recorded)
		if err != nil {
			flog.WithError(err).Warn("manifest not recorded; retrying")
			return true
		}
		m.addon = a
	}
	was := m.addon.Status.Objects
	failure := m.unusable
	var pruned int
	if failure == nil && len(m.failed) == 0 {
		for _, r := range stale(was, m.applied, kept) {
			if err := c.delete(ctx, p, r); err != nil {
				m.failed = append(m.failed, fmt.Errorf("delete %s, no longer in the file: %w", r, err))
				continue
			}
			pruned++
		}
	}
	if failure == nil && len(m.failed) > 0 {
		failure = fmt.Errorf("%s: %w", m.path, errors.Join(m.failed...))
	}

	status := AddonStatus{Objects: m.applied}
	cond := metav1.Condition{Type: conditionApplied, Status: metav1.ConditionTrue, Reason: reasonApplied, Message: fmt.Sprintf("%d objects applied", len(m.applied))}
	if failure != nil {
		status.Objects = union(was, m.applied)
		cond = metav1.Condition{Type: conditionApplied, Status: metav1.ConditionFalse, Reason: reasonApplyFailed, Message: shorten(failure.Error())}
	}
	before := m.addon.applied()
	if err := c.recordStatus(ctx, m.addon, status, cond); err != nil {
		flog.WithError(err).Warn("manifest status not recorded; retrying")
		return true
	}

	if m.unusable != nil {
		c.report(ctx, m.file, m.addon, before, cond, logrus.ErrorLevel)
		return false
	}
	if failure != nil {
		// Retried: a kind may come, a refusal may pass.
		c.report(ctx, m.file, m.addon, before, cond, logrus.WarnLevel)
		return true
	}
	delete(c.reported, m.file)
	changed := m.addon.Spec.Checksum != m.sum
	if changed {
		a, err := c.applySpec(ctx, m.name, m.path, m.sum)
		if err != nil {
			flog.WithError(err).Warn("manifest checksum not recorded; retrying")
			return true
		}
		m.addon = a
	}
	fields := logrus.Fields{"objects": len(m.applied), "deleted": pruned}
	if changed || pruned > 0 || (before != nil && before.Status != metav1.ConditionTrue) {
		c.event(ctx, m.addon, corev1.EventTypeNormal, reasonApplied, fmt.Sprintf("%s: %d objects applied, %d deleted", m.path, len(m.applied), pruned))
		flog.WithFields(fields).Info("manifest applied")
	} else {
		flog.WithFields(fields).Debug("manifest applied, unchanged")
	}
	return false
}

// remove deletes the objects of an Addon whose file is gone, except those
// other manifests apply (kept), and then the Addon. It says whether all
// is gone; what is left is retried.
func (c *Controller) remove(ctx context.Context, p *pass, a *Addon, kept []Ref) bool {
	var errs []error
	for _, r := range stale(a.Status.Objects, nil, kept) {
		if err := c.delete(ctx, p, r); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", r, err))
		}
	}
	alog := log.WithField("file", a.Spec.Source)
	if len(errs) > 0 {
		before := a.applied()
		cond := metav1.Condition{Type: conditionApplied, Status: metav1.ConditionFalse, Reason: reasonRemoveFailed,
			Message: shorten(fmt.Errorf("%s is gone, but not all its objects: %w", a.Spec.Source, errors.Join(errs...)).Error())}
		if err := c.recordStatus(ctx, a, a.Status, cond); err != nil {
			alog.WithError(err).Warn("manifest status not recorded; retrying")
			return false
		}
		c.report(ctx, filepath.Base(a.Spec.Source), a, before, cond, logrus.WarnLevel)
		return false
	}
	err := c.dynamic.Resource(addonResource).Namespace(Namespace).Delete(ctx, a.Name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		alog.WithError(err).Warn("delete the Addon of a removed manifest; retrying")
		return false
	}
	delete(c.reported, filepath.Base(a.Spec.Source))
	alog.WithField("objects", len(a.Status.Objects)).Info("manifest removed, its objects deleted")
	return true
}

// delete deletes one object a manifest applied. An object already gone,
// or whose kind is gone (its CustomResourceDefinition was deleted),
// counts as deleted. A CustomResourceDefinition is left in place and
// counts as deleted too: deleting it would delete every object of its
// kind, which are the user's (a HelmChart's release would even be left
// behind, with no controller to uninstall it).
func (c *Controller) delete(ctx context.Context, p *pass, r Ref) error {
	gk := schema.FromAPIVersionAndKind(r.APIVersion, r.Kind).GroupKind()
	if gk == crdKind {
		log.WithField("crd", r.Name).Info("CustomResourceDefinition no longer in a manifest, kept with its objects: kubectl delete crd " + r.Name + " removes them")
		return nil
	}
	mapping, err := c.mapping(ctx, p, gk)
	if meta.IsNoMatchError(err) {
		return nil
	} else if err != nil {
		return err
	}
	background := metav1.DeletePropagationBackground
	err = c.dynamic.Resource(mapping.Resource).Namespace(r.Namespace).Delete(ctx, r.Name, metav1.DeleteOptions{PropagationPolicy: &background})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// applySpec creates or updates the spec of the Addon name.
func (c *Controller) applySpec(ctx context.Context, name, source, sum string) (*Addon, error) {
	spec, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&AddonSpec{Source: source, Checksum: sum})
	if err != nil {
		return nil, err
	}
	return c.applyAddon(ctx, name, "spec", spec)
}

// recordStatus sets the status of a, unless it is that already. The
// condition keeps its transition time while its status stays.
func (c *Controller) recordStatus(ctx context.Context, a *Addon, status AddonStatus, cond metav1.Condition) error {
	cond.LastTransitionTime = metav1.Now()
	if old := a.applied(); old != nil {
		if old.Status == cond.Status && old.Reason == cond.Reason && old.Message == cond.Message && slices.Equal(a.Status.Objects, status.Objects) {
			return nil
		}
		if old.Status == cond.Status {
			cond.LastTransitionTime = old.LastTransitionTime
		}
	}
	status.Conditions = []metav1.Condition{cond}
	st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&status)
	if err != nil {
		return err
	}
	updated, err := c.applyAddon(ctx, a.Name, "status", st)
	if err != nil {
		return err
	}
	*a = *updated
	return nil
}

// applyAddon applies one part of an Addon, "spec" or "status" (through
// the status subresource).
func (c *Controller) applyAddon(ctx context.Context, name, part string, content map[string]any) (*Addon, error) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Group + "/" + Version,
		"kind":       Kind,
		"metadata":   map[string]any{"name": name, "namespace": Namespace},
		part:         content,
	}}
	var subresources []string
	if part == "status" {
		subresources = append(subresources, "status")
	}
	out, err := c.dynamic.Resource(addonResource).Namespace(Namespace).Apply(ctx, name, u, apply.Options(), subresources...)
	if err != nil {
		return nil, fmt.Errorf("apply the %s of the Addon %s/%s: %w", part, Namespace, name, err)
	}
	return toAddon(out)
}

// report tells of a manifest's failure: in the log once per failure, and
// as an event on its Addon when the failure is new to the Addon (before
// is its condition before the failure was recorded).
func (c *Controller) report(ctx context.Context, file string, a *Addon, before *metav1.Condition, cond metav1.Condition, level logrus.Level) {
	if before == nil || before.Status != cond.Status || before.Message != cond.Message {
		c.event(ctx, a, corev1.EventTypeWarning, cond.Reason, cond.Message)
	}
	c.reportFile(file, errors.New(cond.Message), level)
}

// reportFile logs a file's failure unless it was the last one logged for
// the file.
func (c *Controller) reportFile(file string, err error, level logrus.Level) {
	if c.reported[file] == err.Error() {
		return
	}
	c.reported[file] = err.Error()
	log.WithField("file", filepath.Join(c.dir, file)).WithError(err).
		Log(level, "manifest failed (kubectl -n kube-system describe addon "+addonName(file)+")")
}

// event records an event on an Addon, for kubectl describe. An event that
// cannot be written is only logged: the log has the failure too.
func (c *Controller) event(ctx context.Context, a *Addon, typ, reason, message string) {
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", a.Name, now.UnixNano()), Namespace: Namespace},
		InvolvedObject: corev1.ObjectReference{
			APIVersion: Group + "/" + Version, Kind: Kind, Namespace: Namespace, Name: a.Name,
			UID: a.UID, ResourceVersion: a.ResourceVersion,
		},
		Reason:              reason,
		Message:             message,
		Type:                typ,
		Source:              corev1.EventSource{Component: "kelp"},
		ReportingController: "kelp",
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
	}
	if _, err := c.core.CoreV1().Events(Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		log.WithError(err).WithField("addon", a.Name).Debug("record an event")
	}
}

// shorten keeps a failure's message to the size of an event's: a file of
// many objects that all fail says so in the first few.
func shorten(message string) string {
	const limit = 1024
	if len(message) <= limit {
		return message
	}
	return strings.ToValidUTF8(message[:limit-3], "") + "..."
}
