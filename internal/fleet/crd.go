package fleet

import (
	"context"
	"fmt"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsv1ac "k8s.io/apiextensions-apiserver/pkg/client/applyconfiguration/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"

	"github.com/kelp-dev/kelp/internal/apply"
	"github.com/kelp-dev/kelp/internal/crd"
)

// EnsureCRD applies the Upgrade CustomResourceDefinition, so a newer
// kelp's schema reaches an older cluster, and waits until it is
// established.
func EnsureCRD(ctx context.Context, c apiextensionsclient.Interface) error {
	crds := c.ApiextensionsV1().CustomResourceDefinitions()
	if _, err := crds.Apply(ctx, upgradeCRD(), apply.Options()); err != nil {
		return fmt.Errorf("apply the CustomResourceDefinition %s: %w", crdName, err)
	}
	return crd.WaitEstablished(ctx, c, crdName, 30*time.Second)
}

func upgradeCRD() *apiextensionsv1ac.CustomResourceDefinitionApplyConfiguration {
	props := func(typ string) *apiextensionsv1ac.JSONSchemaPropsApplyConfiguration {
		return apiextensionsv1ac.JSONSchemaProps().WithType(typ)
	}
	object := func(fields map[string]apiextensionsv1ac.JSONSchemaPropsApplyConfiguration) *apiextensionsv1ac.JSONSchemaPropsApplyConfiguration {
		return props("object").WithProperties(fields)
	}
	free := apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr(true)}
	array := func(items apiextensionsv1.JSONSchemaProps) apiextensionsv1ac.JSONSchemaPropsApplyConfiguration {
		return *props("array").WithItems(apiextensionsv1.JSONSchemaPropsOrArray{Schema: &items})
	}
	spec := object(map[string]apiextensionsv1ac.JSONSchemaPropsApplyConfiguration{
		"sha256":       *props("string").WithPattern("^[0-9a-fA-F]{64}$"),
		"url":          *props("string"),
		"allowHTTP":    *props("boolean"),
		"maxSize":      *props("string"),
		"path":         *props("string"),
		"concurrency":  *props("integer").WithMinimum(1),
		"drainTimeout": *props("string"),
		"nodeTimeout":  *props("string"),
	}).WithRequired("sha256")
	status := object(map[string]apiextensionsv1ac.JSONSchemaPropsApplyConfiguration{
		"phase":      *props("string"),
		"target":     *props("string"),
		"nodes":      array(free),
		"conditions": array(free),
	})
	schema := object(map[string]apiextensionsv1ac.JSONSchemaPropsApplyConfiguration{"spec": *spec, "status": *status}).WithRequired("spec")
	column := func(name, typ, path string) *apiextensionsv1ac.CustomResourceColumnDefinitionApplyConfiguration {
		return apiextensionsv1ac.CustomResourceColumnDefinition().WithName(name).WithType(typ).WithJSONPath(path)
	}
	return apiextensionsv1ac.CustomResourceDefinition(crdName).
		WithSpec(apiextensionsv1ac.CustomResourceDefinitionSpec().
			WithGroup(Group).
			WithScope(apiextensionsv1.ClusterScoped).
			WithNames(apiextensionsv1ac.CustomResourceDefinitionNames().
				WithPlural("upgrades").WithSingular("upgrade").WithKind(Kind).WithListKind(Kind + "List")).
			WithVersions(apiextensionsv1ac.CustomResourceDefinitionVersion().
				WithName(Version).WithServed(true).WithStorage(true).
				WithSchema(apiextensionsv1ac.CustomResourceValidation().WithOpenAPIV3Schema(schema)).
				WithSubresources(apiextensionsv1ac.CustomResourceSubresources().WithStatus(apiextensionsv1.CustomResourceSubresourceStatus{})).
				WithAdditionalPrinterColumns(
					column("Phase", "string", ".status.phase"),
					column("Target", "string", ".status.target"),
					column("Message", "string", `.status.conditions[?(@.type=="Ready")].message`),
					column("Age", "date", ".metadata.creationTimestamp"),
				)))
}

func ptr[T any](v T) *T { return &v }
