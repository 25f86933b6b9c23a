package dns

import (
	"context"
	"sort"
	"strings"

	"github.com/sirupsen/logrus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kelp-dev/kelp/internal/reconcile"
)

// CustomConfigMap in kube-system customizes every node's DNS: its "hosts"
// key holds hosts-file lines answered before the cluster's names, and each
// key ending in ".server" holds a CoreDNS server block of its own.
const CustomConfigMap = "coredns-custom"

var log = logrus.WithField("component", "dns")

// CustomOf reads a Custom from the ConfigMap's data.
func CustomOf(data map[string]string) Custom {
	c := Custom{Hosts: data["hosts"]}
	var keys []string
	for k := range data {
		if strings.HasSuffix(k, ".server") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		c.ServerBlocks = append(c.ServerBlocks, data[k])
	}
	return c
}

// watchCustom applies CustomConfigMap whenever it changes, until ctx ends.
// A ConfigMap CoreDNS refuses is logged, not fatal: DNS keeps what it
// served, and the user's next edit is tried again.
func (s *Server) watchCustom(ctx context.Context, client kubernetes.Interface) error {
	// One ConfigMap by name, under the DNS identity: not the node's cache,
	// which holds whole kinds under the node's controller identity.
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace("kube-system"),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", CustomConfigMap).String()
		}))
	configMaps := factory.Core().V1().ConfigMaps()
	return reconcile.Loop{
		Informers: map[string]cache.SharedIndexInformer{"configmaps": configMaps.Informer()},
		Sync: func(context.Context, bool) error {
			var data map[string]string
			cm, err := configMaps.Lister().ConfigMaps("kube-system").Get(CustomConfigMap)
			switch {
			case err == nil:
				data = cm.Data
			case !apierrors.IsNotFound(err):
				return err
			}
			if err := s.Customize(CustomOf(data)); err != nil {
				log.WithError(err).Error("fix the ConfigMap; DNS keeps its previous configuration")
			}
			return nil
		},
	}.Run(ctx)
}
