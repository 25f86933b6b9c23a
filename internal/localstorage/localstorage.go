package localstorage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	k8sinformers "k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	storageinformers "k8s.io/client-go/informers/storage/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	storagehelpers "k8s.io/component-helpers/storage/volume"

	"github.com/kelp-dev/kelp/internal/informer"
	"github.com/kelp-dev/kelp/internal/reconcile"
)

const (
	// coalesce is how long Run waits after a change for more: a
	// StatefulSet scales up many claims at once.
	coalesce = 100 * time.Millisecond
	// retryEvery is how often Run looks for a failed claim or volume whose
	// backoff is over.
	retryEvery = 5 * time.Second
	// firstBackoff and maxBackoff bound the wait after a failure: it
	// doubles with each one.
	firstBackoff = 5 * time.Second
	maxBackoff   = 5 * time.Minute
)

var log = logrus.WithField("component", "local-storage")

// Config is where the node keeps its volumes.
type Config struct {
	// NodeName is the node whose claims are served.
	NodeName string
	// Path holds a directory per volume (--default-local-storage-path);
	// absolute and clean.
	Path string
}

// Run provisions and deletes this node's local-path volumes until ctx
// ends. Until the cluster grants it access it waits, quietly: the grant
// comes with the local-path StorageClass, which `--disable local-storage`
// leaves out, and a node does not know the server's flags.
//
// Claims and StorageClasses come from informers, the node's cache
// (TrimClaim says what of a claim it reads).
func Run(ctx context.Context, client kubernetes.Interface, informers *informer.Cache, cfg Config) error {
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	defer broadcaster.Shutdown()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	events := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: Provisioner, Host: cfg.NodeName})

	// Claims cannot be filtered by annotation or class on the server:
	// every node caches every claim, trimmed. The informers are made here,
	// quiet before anyone can start them, with the index the factory's
	// own have, which its listers use.
	namespaceIndex := cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
	informers.InformerFor(&corev1.PersistentVolumeClaim{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return quiet(coreinformers.NewPersistentVolumeClaimInformer(c, metav1.NamespaceAll, resync, namespaceIndex))
	})
	informers.InformerFor(&storagev1.StorageClass{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return quiet(storageinformers.NewStorageClassInformer(c, resync, namespaceIndex))
	})
	// A list of this node's volumes only, which the node's cache of every
	// object of a kind cannot hold.
	own := k8sinformers.NewSharedInformerFactoryWithOptions(client, 0, k8sinformers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = labels.Set{NodeLabel: cfg.NodeName}.String()
	}))
	claims := informers.Core().V1().PersistentVolumeClaims()
	classes := informers.Storage().V1().StorageClasses()
	volumes := own.Core().V1().PersistentVolumes()
	if err := volumes.Informer().SetWatchErrorHandlerWithContext(quietWhenForbidden); err != nil {
		return fmt.Errorf("watch persistentvolumes: %w", err)
	}
	watched := map[string]cache.SharedIndexInformer{
		"persistentvolumeclaims": claims.Informer(),
		"storageclasses":         classes.Informer(),
		"persistentvolumes":      volumes.Informer(),
	}
	p := &provisioner{
		cfg: cfg, client: client, events: events, failed: reconcile.Backoff[types.UID]{First: firstBackoff, Max: maxBackoff},
		claims: claims.Lister(), classes: classes.Lister(), volumes: volumes.Lister(),
	}
	ctx, cancel := context.WithCancel(ctx)
	defer own.Shutdown()
	defer cancel()
	start := func() {
		informers.Start()
		own.Start(ctx.Done())
	}
	return reconcile.Loop{Informers: watched, Start: start, Coalesce: coalesce, Resync: retryEvery, Sync: p.sync}.Run(ctx)
}

// quiet makes an informer log a refused list or watch at Debug
// (quietWhenForbidden); it has not started, so this cannot fail.
func quiet(i cache.SharedIndexInformer) cache.SharedIndexInformer {
	_ = i.SetWatchErrorHandlerWithContext(quietWhenForbidden)
	return i
}

// quietWhenForbidden logs at Debug that the cluster refused an informer its
// list or watch, and other failures as informers do: without the grant,
// the informers try again every half minute for as long as kelp runs.
func quietWhenForbidden(ctx context.Context, r *cache.Reflector, err error) {
	if apierrors.IsForbidden(err) {
		log.WithError(err).Debug("waiting for access to claims and volumes (ClusterRole kelp:local-storage)")
		return
	}
	cache.DefaultWatchErrorHandler(ctx, r, err)
}

// provisioner is the state of Run between syncs.
type provisioner struct {
	cfg     Config
	client  kubernetes.Interface
	events  record.EventRecorder
	claims  corelisters.PersistentVolumeClaimLister
	classes storagelisters.StorageClassLister
	volumes corelisters.PersistentVolumeLister
	// running says the first sync ran: the cluster granted access.
	running bool
	// failed holds the claims and volumes whose last attempt failed, or
	// that kelp refuses: they are tried again only after their backoff,
	// so a broken disk costs an event now and then, not one per sync.
	failed reconcile.Backoff[types.UID]
}

// sync provisions the claims that wait for this node and deletes the
// released volumes, each unless its backoff holds it.
func (p *provisioner) sync(ctx context.Context, _ bool) error {
	claims, err := p.claims.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list persistent volume claims: %w", err)
	}
	volumes, err := p.volumes.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list persistent volumes: %w", err)
	}
	if !p.running {
		p.running = true
		log.WithField("path", p.cfg.Path).Info("local-path provisioner running")
	}
	exists := map[string]bool{}
	for _, v := range volumes {
		exists[v.Name] = true
	}
	pending := map[types.UID]bool{}
	for _, claim := range claims {
		if !wantsVolume(claim, p.cfg.NodeName) || exists[volumeName(claim)] {
			continue
		}
		class, err := p.classes.Get(storagehelpers.GetPersistentVolumeClaimClass(claim))
		if err != nil || class.Provisioner != Provisioner {
			continue // the class's own event brings another sync
		}
		pending[claim.UID] = true
		if p.failed.Due(claim.UID) {
			p.provision(ctx, claim, class)
		}
	}
	for _, v := range volumes {
		if !toDelete(v) {
			continue
		}
		pending[v.UID] = true
		if p.failed.Due(v.UID) {
			p.delete(ctx, v)
		}
	}
	p.failed.Keep(pending)
	return nil
}

// provision makes claim's directory and its volume, or says on the claim
// why it cannot.
func (p *provisioner) provision(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) {
	l := log.WithField("claim", claim.Namespace+"/"+claim.Name)
	if err := refusal(claim); err != nil {
		p.failed.Refuse(claim.UID)
		l.WithError(err).Warn("local-path volume refused")
		p.events.Event(claim, corev1.EventTypeWarning, "ProvisioningFailed", err.Error())
		return
	}
	dir := filepath.Join(p.cfg.Path, dirName(claim))
	created, err := p.makeDir(dir)
	if err != nil {
		p.failed.Fail(claim.UID)
		err = fmt.Errorf("create the volume's directory under %s on node %s: %w; make %[1]s writable by root there, or start kelp with --default-local-storage-path set to a writable directory",
			p.cfg.Path, p.cfg.NodeName, err)
		l.WithError(err).Warn("local-path volume not provisioned; trying again")
		p.events.Event(claim, corev1.EventTypeWarning, "ProvisioningFailed", err.Error())
		return
	}
	volume := volumeFor(claim, class, p.cfg.NodeName, dir)
	_, err = p.client.CoreV1().PersistentVolumes().Create(ctx, volume, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		// Made by the last sync; the cache has not seen it yet.
	case err != nil:
		p.failed.Fail(claim.UID)
		if created {
			_ = os.Remove(dir) // empty: no pod had it
		}
		l.WithError(err).Warn("local-path volume not created; trying again")
		p.events.Eventf(claim, corev1.EventTypeWarning, "ProvisioningFailed", "create the volume %s: %v", volume.Name, err)
	default:
		p.failed.Forget(claim.UID)
		l.WithFields(logrus.Fields{"volume": volume.Name, "path": dir}).Info("local-path volume provisioned")
		p.events.Eventf(claim, corev1.EventTypeNormal, "ProvisioningSucceeded", "Successfully provisioned volume %s at %s on node %s", volume.Name, dir, p.cfg.NodeName)
	}
}

// makeDir makes dir, and the storage path if need be, and says whether it
// made dir. Anyone may write to dir, as with local-path-provisioner: pods
// that run as another user than root must be able to use their volume,
// and no other pod can reach it.
func (p *provisioner) makeDir(dir string) (bool, error) {
	if err := os.MkdirAll(p.cfg.Path, 0o700); err != nil {
		return false, err
	}
	err := os.Mkdir(dir, 0o777)
	created := err == nil
	if err != nil && !errors.Is(err, os.ErrExist) {
		return false, err
	}
	// Mkdir's mode passes through the umask.
	return created, os.Chmod(dir, 0o777)
}

// delete removes volume's directory if its reclaim policy says Delete,
// then its finalizer, then the volume unless it is being deleted already;
// or says on the volume why it cannot.
func (p *provisioner) delete(ctx context.Context, volume *corev1.PersistentVolume) {
	l := log.WithField("volume", volume.Name)
	removeDir := volume.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete
	if removeDir && !ownDir(p.cfg.Path, volume) {
		p.failed.Refuse(volume.UID)
		msg := fmt.Sprintf("the volume's path is not the directory kelp made for it under this node's storage path %s (pvc-<claim UID>_<namespace>_<claim>, of the claim the volume was made for): kelp does not remove it; remove what needs removing and delete the volume yourself", p.cfg.Path)
		l.Warn(msg)
		p.events.Event(volume, corev1.EventTypeWarning, "VolumeFailedDelete", msg)
		if volume.DeletionTimestamp == nil {
			return
		}
		removeDir = false // deleted by hand: it goes, its path stays
	}
	var dir string
	if removeDir {
		dir = volume.Spec.Local.Path
		if err := os.RemoveAll(dir); err != nil {
			p.failed.Fail(volume.UID)
			l.WithError(err).Warn("local-path volume's directory not removed; trying again")
			p.events.Eventf(volume, corev1.EventTypeWarning, "VolumeFailedDelete", "remove %s on node %s: %v", dir, p.cfg.NodeName, err)
			return
		}
	}
	if slices.Contains(volume.Finalizers, Finalizer) {
		// An update, not a patch: it must not drop a finalizer that
		// another controller added meanwhile.
		updated := volume.DeepCopy()
		updated.Finalizers = slices.DeleteFunc(updated.Finalizers, func(f string) bool { return f == Finalizer })
		_, err := p.client.CoreV1().PersistentVolumes().Update(ctx, updated, metav1.UpdateOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			p.failed.Fail(volume.UID)
			l.WithError(err).Warn("local-path volume's finalizer not removed; trying again")
			return
		}
	}
	if volume.DeletionTimestamp == nil {
		err := p.client.CoreV1().PersistentVolumes().Delete(ctx, volume.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &volume.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			p.failed.Fail(volume.UID)
			l.WithError(err).Warn("local-path volume not deleted; trying again")
			return
		}
	}
	p.failed.Forget(volume.UID)
	l.WithField("path", dir).Info("local-path volume deleted")
}

// TrimClaim keeps of a claim only what sync reads, and of a claim of
// another node only its name: every node caches every claim.
func TrimClaim(node string) cache.TransformFunc {
	return func(obj any) (any, error) {
		claim, ok := obj.(*corev1.PersistentVolumeClaim)
		if !ok {
			return obj, nil
		}
		meta := metav1.ObjectMeta{Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID, ResourceVersion: claim.ResourceVersion}
		if claim.Annotations[storagehelpers.AnnSelectedNode] != node {
			return &corev1.PersistentVolumeClaim{ObjectMeta: meta}, nil
		}
		meta.DeletionTimestamp = claim.DeletionTimestamp
		meta.Annotations = map[string]string{}
		for _, k := range []string{storagehelpers.AnnSelectedNode, storagehelpers.AnnStorageProvisioner, storagehelpers.AnnBetaStorageProvisioner, corev1.BetaStorageClassAnnotation} {
			if v, ok := claim.Annotations[k]; ok {
				meta.Annotations[k] = v
			}
		}
		return &corev1.PersistentVolumeClaim{ObjectMeta: meta, Spec: claim.Spec}, nil
	}
}
