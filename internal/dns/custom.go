package dns

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
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
func (s *Server) watchCustom(ctx context.Context, client kubernetes.Interface) error {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace("kube-system"),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", CustomConfigMap).String()
		}))
	apply := func(data map[string]string) {
		if err := s.Customize(CustomOf(data)); err != nil {
			log.WithError(err).Error("fix the ConfigMap; DNS keeps its previous configuration")
		}
	}
	_, err := factory.Core().V1().ConfigMaps().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { apply(o.(*corev1.ConfigMap).Data) },
		UpdateFunc: func(_, o any) { apply(o.(*corev1.ConfigMap).Data) },
		DeleteFunc: func(any) { apply(nil) },
	})
	if err != nil {
		return fmt.Errorf("watch %s: %w", CustomConfigMap, err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	<-ctx.Done()
	return nil
}
