package token

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"
)

// Join tokens made by `kelp token create` are bootstrap tokens, Secrets of
// the upstream type in kube-system: the controller-manager's token cleaner
// deletes them once they expire. kelp's carry a label of their own.
const bootstrapLabel = "kelp.io/join-token"

// Bootstrap describes a token made by `kelp token create`.
type Bootstrap struct {
	ID          string
	Expires     time.Time // zero: never
	Description string
}

// CreateBootstrap makes a join token that lasts ttl (0: forever) and
// returns its secret, "<id>.<secret>".
func CreateBootstrap(ctx context.Context, c kubernetes.Interface, ttl time.Duration, description string) (string, error) {
	secret, err := bootstraputil.GenerateBootstrapToken()
	if err != nil {
		return "", fmt.Errorf("token: %w", err)
	}
	id, rest, _ := strings.Cut(secret, ".")
	data := map[string][]byte{
		bootstrapapi.BootstrapTokenIDKey:     []byte(id),
		bootstrapapi.BootstrapTokenSecretKey: []byte(rest),
	}
	if ttl > 0 {
		data[bootstrapapi.BootstrapTokenExpirationKey] = []byte(time.Now().Add(ttl).UTC().Format(time.RFC3339))
	}
	if description != "" {
		data[bootstrapapi.BootstrapTokenDescriptionKey] = []byte(description)
	}
	_, err = c.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: bootstraputil.BootstrapTokenSecretName(id), Labels: map[string]string{bootstrapLabel: "true"}},
		Type:       bootstrapapi.SecretTypeBootstrapToken,
		Data:       data,
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("create join token: %w", err)
	}
	return secret, nil
}

// ListBootstrap lists the tokens `kelp token create` made, by ID.
func ListBootstrap(ctx context.Context, c kubernetes.Interface) ([]Bootstrap, error) {
	list, err := c.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{LabelSelector: bootstrapLabel + "=true"})
	if err != nil {
		return nil, fmt.Errorf("list join tokens: %w", err)
	}
	var out []Bootstrap
	for _, s := range list.Items {
		b := Bootstrap{ID: string(s.Data[bootstrapapi.BootstrapTokenIDKey]), Description: string(s.Data[bootstrapapi.BootstrapTokenDescriptionKey])}
		if exp := s.Data[bootstrapapi.BootstrapTokenExpirationKey]; len(exp) > 0 {
			b.Expires, _ = time.Parse(time.RFC3339, string(exp))
		}
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b Bootstrap) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// DeleteBootstrap deletes the token with id.
func DeleteBootstrap(ctx context.Context, c kubernetes.Interface, id string) error {
	err := c.CoreV1().Secrets(metav1.NamespaceSystem).Delete(ctx, bootstraputil.BootstrapTokenSecretName(id), metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("no join token %q: `kelp token list` shows them", id)
	}
	if err != nil {
		return fmt.Errorf("delete join token: %w", err)
	}
	return nil
}

// IsBootstrap says whether secret has the shape of a bootstrap token.
func IsBootstrap(secret string) bool {
	return bootstraputil.IsValidBootstrapToken(secret)
}

// VerifyBootstrap says whether secret is a live token made by `kelp token
// create`.
func VerifyBootstrap(ctx context.Context, c kubernetes.Interface, secret string, now time.Time) (bool, error) {
	id, rest, ok := strings.Cut(secret, ".")
	if !ok || !IsBootstrap(secret) {
		return false, nil
	}
	s, err := c.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, bootstraputil.BootstrapTokenSecretName(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if s.Labels[bootstrapLabel] != "true" || !Equal(string(s.Data[bootstrapapi.BootstrapTokenSecretKey]), rest) {
		return false, nil
	}
	if exp := s.Data[bootstrapapi.BootstrapTokenExpirationKey]; len(exp) > 0 {
		t, err := time.Parse(time.RFC3339, string(exp))
		if err != nil || !now.Before(t) {
			return false, nil
		}
	}
	return true, nil
}
