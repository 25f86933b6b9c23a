// Package crd waits for CustomResourceDefinitions kelp applies: their
// kinds are served only once the apiserver has established them.
package crd

import (
	"context"
	"fmt"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// WaitEstablished waits up to timeout until the apiserver serves the
// custom resources of the CustomResourceDefinition name.
func WaitEstablished(ctx context.Context, c apiextensionsclient.Interface, name string, timeout time.Duration) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		crd, err := c.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, cond := range crd.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
			if cond.Type == apiextensionsv1.NamesAccepted && cond.Status == apiextensionsv1.ConditionFalse {
				last = cond.Message
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("the CustomResourceDefinition %s is not established (%s): %w", name, last, err)
	}
	return nil
}
