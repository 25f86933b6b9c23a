package localstorage

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/kelp-dev/kelp/internal/reconcile"
)

// fixture is a provisioner for node n1 whose caches hold what the test
// puts in them, over a fake cluster, with a clock the test moves.
type fixture struct {
	p                        *provisioner
	client                   *fake.Clientset
	claims, volumes, classes cache.Indexer
	events                   *record.FakeRecorder
	clock                    time.Time
}

func newFixture(t *testing.T, path string) *fixture {
	f := &fixture{
		client:  fake.NewClientset(),
		claims:  cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}),
		volumes: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}),
		classes: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}),
		events:  record.NewFakeRecorder(100),
		clock:   time.Unix(1000, 0),
	}
	f.p = &provisioner{
		cfg: Config{NodeName: "n1", Path: path}, client: f.client, events: f.events,
		claims: corelisters.NewPersistentVolumeClaimLister(f.claims), volumes: corelisters.NewPersistentVolumeLister(f.volumes),
		classes: storagelisters.NewStorageClassLister(f.classes),
		failed:  reconcile.Backoff[types.UID]{First: firstBackoff, Max: maxBackoff, Now: func() time.Time { return f.clock }},
	}
	f.add(t, f.classes, class("local-path", nil))
	return f
}

func (f *fixture) add(t *testing.T, store cache.Indexer, obj runtime.Object) {
	t.Helper()
	if err := store.Add(obj); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) sync(t *testing.T) {
	t.Helper()
	if err := f.p.sync(context.Background(), false); err != nil {
		t.Fatalf("sync: %v", err)
	}
}

// event is the next event, or "" if there is none.
func (f *fixture) event() string {
	select {
	case e := <-f.events.Events:
		return e
	default:
		return ""
	}
}

func (f *fixture) volume(t *testing.T, name string) *corev1.PersistentVolume {
	t.Helper()
	v, err := f.client.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// A claim placed on this node gets a directory anyone may write to, and a
// volume there; claims of other nodes and classes are left alone, and a
// volume already made is not made again.
func TestProvision(t *testing.T) {
	root := filepath.Join(t.TempDir(), "storage")
	f := newFixture(t, root)
	nfs := class("nfs", nil)
	nfs.Provisioner = "example.com/nfs"
	f.add(t, f.classes, nfs)
	f.add(t, f.claims, claim("data-0"))
	f.add(t, f.claims, claim("data-1", func(c *corev1.PersistentVolumeClaim) {
		c.Annotations["volume.kubernetes.io/selected-node"] = "n2"
	}))
	f.add(t, f.claims, claim("data-2", func(c *corev1.PersistentVolumeClaim) { c.Spec.StorageClassName = &nfs.Name }))
	f.sync(t)

	dir := filepath.Join(root, "pvc-uid-0_apps_data-0")
	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o777 {
		t.Errorf("%s has mode %v, want 0777", dir, st.Mode().Perm())
	}
	v := f.volume(t, "pvc-uid-0")
	if v == nil || v.Spec.Local.Path != dir || v.Spec.ClaimRef.UID != "uid-0" {
		t.Fatalf("volume %+v, want one at %s for the claim", v, dir)
	}
	if e := f.event(); !strings.HasPrefix(e, "Normal ProvisioningSucceeded") || !strings.Contains(e, dir) {
		t.Errorf("event %q", e)
	}
	if f.volume(t, "pvc-uid-1") != nil || f.volume(t, "pvc-uid-2") != nil {
		t.Error("a claim of another node or class got a volume here")
	}

	f.add(t, f.volumes, v)
	f.sync(t)
	if e := f.event(); e != "" {
		t.Errorf("a volume already made is made again: %q", e)
	}
}

// A storage path that cannot be made fails the claim with a Warning that
// names the path and what to do, tried again only after a growing
// backoff; once the path is fixed, the claim gets its volume.
func TestProvisionUnwritable(t *testing.T) {
	blocker := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(blocker, "storage")
	f := newFixture(t, root)
	f.add(t, f.claims, claim("data-0"))
	f.sync(t)
	e := f.event()
	if !strings.HasPrefix(e, "Warning ProvisioningFailed") || !strings.Contains(e, root) || !strings.Contains(e, "--default-local-storage-path") {
		t.Errorf("event %q, want a warning naming %s and the flag", e, root)
	}

	for _, wait := range []time.Duration{firstBackoff, 2 * firstBackoff} {
		f.clock = f.clock.Add(wait - time.Second)
		f.sync(t)
		if e := f.event(); e != "" {
			t.Errorf("tried again within the backoff of %v: %q", wait, e)
		}
		f.clock = f.clock.Add(time.Second)
		f.sync(t)
		if e := f.event(); !strings.HasPrefix(e, "Warning ProvisioningFailed") {
			t.Errorf("not tried again after the backoff of %v: %q", wait, e)
		}
	}

	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	f.clock = f.clock.Add(maxBackoff)
	f.sync(t)
	if f.volume(t, "pvc-uid-0") == nil {
		t.Error("no volume once the path is fixed")
	}
	if f.p.failed.Len() != 0 {
		t.Errorf("backoff kept after success: %v", f.p.failed)
	}
}

// A claim kelp cannot serve gets one Warning and no volume.
func TestProvisionRefused(t *testing.T) {
	root := filepath.Join(t.TempDir(), "storage")
	f := newFixture(t, root)
	f.add(t, f.claims, claim("data-0", func(c *corev1.PersistentVolumeClaim) {
		c.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
	}))
	f.sync(t)
	if e := f.event(); !strings.HasPrefix(e, "Warning ProvisioningFailed") || !strings.Contains(e, "ReadWriteMany") {
		t.Errorf("event %q", e)
	}
	f.clock = f.clock.Add(time.Hour)
	f.sync(t)
	if e := f.event(); e != "" {
		t.Errorf("refused twice: %q", e)
	}
	if f.volume(t, "pvc-uid-0") != nil {
		t.Error("a refused claim got a volume")
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("a refused claim made the storage path: %v", err)
	}

	// The claim is gone: so is what was remembered of it.
	if err := f.claims.Delete(claim("data-0")); err != nil {
		t.Fatal(err)
	}
	f.sync(t)
	if f.p.failed.Len() != 0 {
		t.Errorf("a deleted claim is remembered: %v", f.p.failed)
	}
}

// A released volume loses its directory, then itself; a volume whose path
// is not a volume directory under the storage path keeps both, and says
// so once.
func TestDelete(t *testing.T) {
	tmp := t.TempDir()
	root := filepath.Join(tmp, "storage")
	f := newFixture(t, root)
	dir := filepath.Join(root, "pvc-uid-0_apps_data-0")
	outside := filepath.Join(tmp, "precious")
	// pvc-uid-1 exists, so that the path through it leads out.
	for _, d := range []string{filepath.Join(dir, "sub"), filepath.Join(root, "pvc-uid-1"), outside} {
		if err := os.MkdirAll(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	released := func(c *corev1.PersistentVolumeClaim, path string) *corev1.PersistentVolume {
		v := volumeFor(c, class("local-path", nil), "n1", path)
		v.UID = c.UID
		v.Status.Phase = corev1.VolumeReleased
		if _, err := f.client.CoreV1().PersistentVolumes().Create(context.Background(), v, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.add(t, f.volumes, v)
		return v
	}
	released(claim("data-0"), dir)
	escape := released(claim("data-1"), root+"/pvc-uid-1/../../precious")
	bound := released(claim("data-2"), filepath.Join(root, "pvc-uid-2_apps_data-2"))
	bound.Status.Phase = corev1.VolumeBound
	f.add(t, f.volumes, bound)
	f.sync(t)

	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s of a released volume is still there: %v", dir, err)
	}
	if f.volume(t, "pvc-uid-0") != nil {
		t.Error("the released volume is still there")
	}
	if _, err := os.Stat(outside); err != nil {
		t.Errorf("a path outside the storage path was removed: %v", err)
	}
	if f.volume(t, escape.Name) == nil || f.volume(t, bound.Name) == nil {
		t.Error("a volume kelp must keep was deleted")
	}
	if e := f.event(); !strings.HasPrefix(e, "Warning VolumeFailedDelete") || !strings.Contains(e, root) {
		t.Errorf("event %q", e)
	}
	f.clock = f.clock.Add(time.Hour)
	f.sync(t)
	if e := f.event(); e != "" {
		t.Errorf("second event: %q", e)
	}
}

// A volume made to look like kelp's, released or deleted by hand, that
// points at another claim's live directory does not take that data with
// it: the directory is not the one kelp made for it.
func TestDeleteForged(t *testing.T) {
	root := filepath.Join(t.TempDir(), "storage")
	f := newFixture(t, root)
	victim := claim("data-2")
	dir := filepath.Join(root, dirName(victim))
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	if err := os.WriteFile(data, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	live := volumeFor(victim, class("local-path", nil), "n1", dir)
	live.UID, live.Status.Phase = victim.UID, corev1.VolumeBound
	forged := func(name string, c *corev1.PersistentVolumeClaim, change func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
		v := volumeFor(c, class("local-path", nil), "n1", dir)
		v.Name, v.UID, v.Status.Phase = name, types.UID("forged-"+name), corev1.VolumeReleased
		change(v)
		return v
	}
	volumes := []*corev1.PersistentVolume{
		live,
		// Another claim's volume, as kelp would make it, but for the path.
		forged("pvc-uid-3", claim("data-3"), func(*corev1.PersistentVolume) {}),
		// The victim's claim, under another name.
		forged("pvc-forged", victim, func(*corev1.PersistentVolume) {}),
		// Deleted by hand: it goes, the directory stays.
		forged("pvc-uid-4", claim("data-4"), func(v *corev1.PersistentVolume) {
			v.DeletionTimestamp = &metav1.Time{Time: f.clock}
		}),
	}
	for _, v := range volumes {
		if _, err := f.client.CoreV1().PersistentVolumes().Create(context.Background(), v, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.add(t, f.volumes, v)
	}
	f.sync(t)
	if got, err := os.ReadFile(data); err != nil || string(got) != "precious" {
		t.Errorf("the live claim's data: %q, %v", got, err)
	}
	for _, name := range []string{live.Name, "pvc-uid-3", "pvc-forged"} {
		if f.volume(t, name) == nil {
			t.Errorf("volume %s was deleted", name)
		}
	}
	if v := f.volume(t, "pvc-uid-4"); v == nil || slices.Contains(v.Finalizers, Finalizer) {
		t.Errorf("the forged volume deleted by hand: %+v, want it without kelp's finalizer", v)
	}
	for range 3 {
		if e := f.event(); !strings.HasPrefix(e, "Warning VolumeFailedDelete") || !strings.Contains(e, "not the directory kelp made for it") {
			t.Errorf("event %q", e)
		}
	}
}

// A volume deleted by hand keeps its directory while a claim holds it;
// then it loses its directory and its finalizer, and kelp does not delete
// it again. One whose policy was changed to Retain keeps its directory.
func TestDeletedByHand(t *testing.T) {
	root := filepath.Join(t.TempDir(), "storage")
	f := newFixture(t, root)
	deleted := func(c *corev1.PersistentVolumeClaim, policy corev1.PersistentVolumeReclaimPolicy) (*corev1.PersistentVolume, string) {
		dir := filepath.Join(root, dirName(c))
		if err := os.MkdirAll(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		v := volumeFor(c, class("local-path", nil), "n1", dir)
		if !slices.Contains(v.Finalizers, Finalizer) {
			t.Fatalf("a volume of a Delete class has finalizers %v", v.Finalizers)
		}
		v.UID, v.Spec.PersistentVolumeReclaimPolicy = c.UID, policy
		v.Finalizers = append(v.Finalizers, pvProtection)
		v.DeletionTimestamp = &metav1.Time{Time: f.clock}
		if _, err := f.client.CoreV1().PersistentVolumes().Create(context.Background(), v, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.add(t, f.volumes, v)
		return v, dir
	}
	drop, dropDir := deleted(claim("data-0"), corev1.PersistentVolumeReclaimDelete)
	keep, keepDir := deleted(claim("data-1"), corev1.PersistentVolumeReclaimRetain)
	f.sync(t)
	if _, err := os.Stat(dropDir); err != nil {
		t.Errorf("the directory of a volume a claim still holds was removed: %v", err)
	}

	for _, v := range []*corev1.PersistentVolume{drop, keep} {
		v.Finalizers = []string{Finalizer}
		f.add(t, f.volumes, v)
	}
	f.client.ClearActions()
	f.sync(t)
	if _, err := os.Stat(dropDir); !os.IsNotExist(err) {
		t.Errorf("%s of a volume deleted by hand is still there: %v", dropDir, err)
	}
	if _, err := os.Stat(keepDir); err != nil {
		t.Errorf("the directory of a Retain volume was removed: %v", err)
	}
	for _, name := range []string{drop.Name, keep.Name} {
		if v := f.volume(t, name); v == nil || len(v.Finalizers) != 0 {
			t.Errorf("volume %s: %+v, want it there without kelp's finalizer", name, v)
		}
	}
	for _, a := range f.client.Actions() {
		if a.GetVerb() == "delete" {
			t.Errorf("a volume being deleted was deleted again: %v", a)
		}
	}
}

// Of a claim placed on another node only its name is cached; of this
// node's, what sync reads.
func TestTrimClaim(t *testing.T) {
	trim := TrimClaim("n1")
	other := claim("data-1", func(c *corev1.PersistentVolumeClaim) {
		c.Annotations["volume.kubernetes.io/selected-node"] = "n2"
		c.Labels = map[string]string{"app": "db"}
	})
	got, err := trim(other)
	if err != nil {
		t.Fatal(err)
	}
	if c := got.(*corev1.PersistentVolumeClaim); c.Name != "data-1" || c.Annotations != nil || c.Labels != nil || c.Spec.AccessModes != nil {
		t.Errorf("another node's claim kept %+v", c)
	}

	mine := claim("data-0", func(c *corev1.PersistentVolumeClaim) {
		c.Annotations["kubectl.kubernetes.io/last-applied-configuration"] = strings.Repeat("x", 1000)
		c.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	})
	got, err = trim(mine)
	if err != nil {
		t.Fatal(err)
	}
	c := got.(*corev1.PersistentVolumeClaim)
	if c.ManagedFields != nil || len(c.Annotations) != 2 {
		t.Errorf("this node's claim kept %+v", c.ObjectMeta)
	}
	if !wantsVolume(c, "n1") || refusal(c) != nil || c.UID != mine.UID {
		t.Error("the trimmed claim is not what sync needs")
	}
}
