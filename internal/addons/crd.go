package addons

import (
	"context"
	"fmt"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsv1ac "k8s.io/apiextensions-apiserver/pkg/client/applyconfiguration/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kelp-dev/kelp/internal/apply"
	"github.com/kelp-dev/kelp/internal/crd"
)

// The Addon kind: one object per manifest file, in Namespace.
const (
	Group     = "kelp.io"
	Version   = "v1"
	Kind      = "Addon"
	Namespace = metav1.NamespaceSystem
	crdName   = "addons." + Group
)

var (
	addonResource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "addons"}
	crdKind       = schema.GroupKind{Group: apiextensionsv1.GroupName, Kind: "CustomResourceDefinition"}
)

// Addon is what an Addon object holds.
type Addon struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              AddonSpec   `json:"spec"`
	Status            AddonStatus `json:"status,omitempty"`
}

// AddonSpec is a manifest file and the content last applied from it.
type AddonSpec struct {
	// Source is the file's path.
	Source string `json:"source"`
	// Checksum is the sha256 of the content last applied in full; empty
	// until one was.
	Checksum string `json:"checksum,omitempty"`
}

// AddonStatus is what applying the file did.
type AddonStatus struct {
	// Objects are the objects applied from the file, which removing the
	// file deletes.
	Objects []Ref `json:"objects,omitempty"`
	// Conditions hold one condition, Applied: True once the file's
	// content is applied in full, False with the reason while it cannot
	// be.
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// conditionApplied is the type of an Addon's one condition.
const conditionApplied = "Applied"

// applied is a copy of the Addon's Applied condition, or nil.
func (a *Addon) applied() *metav1.Condition {
	for _, c := range a.Status.Conditions {
		if c.Type == conditionApplied {
			return &c
		}
	}
	return nil
}

// ensureCRD applies the Addon CustomResourceDefinition, so a newer kelp's
// schema reaches an older cluster, and waits until it is established.
func ensureCRD(ctx context.Context, c apiextensionsclient.Interface) error {
	crds := c.ApiextensionsV1().CustomResourceDefinitions()
	if _, err := crds.Apply(ctx, addonCRD(), apply.Options()); err != nil {
		return fmt.Errorf("apply the CustomResourceDefinition %s: %w", crdName, err)
	}
	return crd.WaitEstablished(ctx, c, crdName, 30*time.Second)
}

func addonCRD() *apiextensionsv1ac.CustomResourceDefinitionApplyConfiguration {
	str := func() apiextensionsv1.JSONSchemaProps { return apiextensionsv1.JSONSchemaProps{Type: "string"} }
	ref := apiextensionsv1.JSONSchemaProps{
		Type:     "object",
		Required: []string{"apiVersion", "kind", "name"},
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"apiVersion": str(), "kind": str(), "namespace": str(), "name": str(),
		},
	}
	condition := apiextensionsv1.JSONSchemaProps{
		Type:     "object",
		Required: []string{"type", "status", "lastTransitionTime", "reason", "message"},
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"type": str(), "status": str(), "reason": str(), "message": str(),
			"observedGeneration": {Type: "integer", Format: "int64"},
			"lastTransitionTime": {Type: "string", Format: "date-time"},
		},
	}
	object := func(props map[string]apiextensionsv1ac.JSONSchemaPropsApplyConfiguration) apiextensionsv1ac.JSONSchemaPropsApplyConfiguration {
		return *apiextensionsv1ac.JSONSchemaProps().WithType("object").WithProperties(props)
	}
	array := func(items apiextensionsv1.JSONSchemaProps) apiextensionsv1ac.JSONSchemaPropsApplyConfiguration {
		return *apiextensionsv1ac.JSONSchemaProps().WithType("array").WithItems(apiextensionsv1.JSONSchemaPropsOrArray{Schema: &items})
	}
	scalar := func(typ string) apiextensionsv1ac.JSONSchemaPropsApplyConfiguration {
		return *apiextensionsv1ac.JSONSchemaProps().WithType(typ)
	}
	spec := object(map[string]apiextensionsv1ac.JSONSchemaPropsApplyConfiguration{
		"source":   scalar("string"),
		"checksum": scalar("string"),
	})
	spec.WithRequired("source")
	schema := object(map[string]apiextensionsv1ac.JSONSchemaPropsApplyConfiguration{
		"spec": spec,
		"status": object(map[string]apiextensionsv1ac.JSONSchemaPropsApplyConfiguration{
			"objects":    array(ref),
			"conditions": array(condition),
		}),
	})
	column := func(name, typ, path string) *apiextensionsv1ac.CustomResourceColumnDefinitionApplyConfiguration {
		return apiextensionsv1ac.CustomResourceColumnDefinition().WithName(name).WithType(typ).WithJSONPath(path)
	}
	return apiextensionsv1ac.CustomResourceDefinition(crdName).
		WithSpec(apiextensionsv1ac.CustomResourceDefinitionSpec().
			WithGroup(Group).
			WithScope(apiextensionsv1.NamespaceScoped).
			WithNames(apiextensionsv1ac.CustomResourceDefinitionNames().
				WithPlural("addons").WithSingular("addon").WithKind(Kind).WithListKind(Kind + "List")).
			WithVersions(apiextensionsv1ac.CustomResourceDefinitionVersion().
				WithName(Version).WithServed(true).WithStorage(true).
				WithSchema(apiextensionsv1ac.CustomResourceValidation().WithOpenAPIV3Schema(&schema)).
				WithSubresources(apiextensionsv1ac.CustomResourceSubresources().WithStatus(apiextensionsv1.CustomResourceSubresourceStatus{})).
				WithAdditionalPrinterColumns(
					column("Source", "string", ".spec.source"),
					column("Applied", "string", `.status.conditions[?(@.type=="Applied")].status`),
					column("Age", "date", ".metadata.creationTimestamp"),
				)))
}
