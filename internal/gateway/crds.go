package gateway

import (
	"context"
	"fmt"
	"io/fs"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/types"
	networkingv1ac "k8s.io/client-go/applyconfigurations/networking/v1"
	"k8s.io/client-go/kubernetes"
	gatewayv1ac "sigs.k8s.io/gateway-api/applyconfiguration/apis/v1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	"sigs.k8s.io/yaml"

	"github.com/kelp-dev/kelp/internal/apply"
	"github.com/kelp-dev/kelp/internal/crd"
)

// Install applies the Gateway API CRDs (one YAML file each in crds), waits
// until the apiserver serves them, and applies the GatewayClass kelp and
// the IngressClass kelp: a newer kelp's CRDs and classes reach an older
// cluster at its first start.
func Install(ctx context.Context, kube kubernetes.Interface, ext apiextensionsclient.Interface, gw gatewayclient.Interface, crds fs.FS) error {
	files, err := fs.Glob(crds, "*.yaml")
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("kelp carries no Gateway API CRDs: it was built without scripts/gateway-crds.sh (scripts/build.sh runs it)")
	}
	var names []string
	for _, f := range files {
		raw, err := fs.ReadFile(crds, f)
		if err != nil {
			return err
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(raw, &crd); err != nil {
			return fmt.Errorf("read the embedded Gateway API CRD %s: %w", f, err)
		}
		body, err := yaml.YAMLToJSON(raw)
		if err != nil {
			return fmt.Errorf("read the embedded Gateway API CRD %s: %w", f, err)
		}
		if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Patch(ctx, crd.Name, types.ApplyPatchType, body,
			apply.PatchOptions()); err != nil {
			return fmt.Errorf("apply the CustomResourceDefinition %s: %w", crd.Name, err)
		}
		names = append(names, crd.Name)
	}
	for _, name := range names {
		if err := crd.WaitEstablished(ctx, ext, name, time.Minute); err != nil {
			return err
		}
	}
	class := gatewayv1ac.GatewayClass(ClassName).
		WithSpec(gatewayv1ac.GatewayClassSpec().
			WithControllerName(ControllerName).
			WithDescription("kelp's built-in Gateway, served by every node"))
	if _, err := gw.GatewayV1().GatewayClasses().Apply(ctx, class, apply.Options()); err != nil {
		return fmt.Errorf("apply the GatewayClass %s: %w", ClassName, err)
	}
	ingressClass := networkingv1ac.IngressClass(IngressClassName).
		WithSpec(networkingv1ac.IngressClassSpec().WithController(string(ControllerName)))
	if _, err := kube.NetworkingV1().IngressClasses().Apply(ctx, ingressClass, apply.Options()); err != nil {
		return fmt.Errorf("apply the IngressClass %s: %w", IngressClassName, err)
	}
	return nil
}
