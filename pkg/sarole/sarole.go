// Package sarole reads the role a ServiceAccount names for its pods' web-identity datasets
// (roleFrom=serviceAccount; docs/security.md): its cistern.csi.dev/role-arn annotation, or else
// IRSA's eks.amazonaws.com/role-arn, so a ServiceAccount set up for IRSA needs nothing more. The
// node plugin only gets the one ServiceAccount a publishing pod runs as (RBAC: get, no list or
// watch). Which role is asked for is not the trust decision: the STS is (the role's trust policy).
package sarole

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// Reader reads ServiceAccounts from the API server; it implements datasource.ServiceAccountRoles.
type Reader struct {
	Client corev1client.ServiceAccountsGetter
}

// RoleARN returns the role ServiceAccount namespace/name names, or "" when it names none. A
// missing ServiceAccount or a node plugin the RBAC does not let read it is Invalid (a
// configuration to fix); anything else Retryable.
func (r Reader) RoleARN(ctx context.Context, namespace, name string) (string, error) {
	sa, err := r.Client.ServiceAccounts(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", source.Errorf(source.Invalid, "ServiceAccount %s/%s does not exist", namespace, name)
	case apierrors.IsForbidden(err):
		return "", source.Wrap(source.Invalid, err, "the node plugin may not read the pod's ServiceAccount (it needs get on serviceaccounts: deploy/csi's cistern-node-serviceaccounts)")
	case err != nil:
		return "", source.Wrap(source.Retryable, err, "reading the pod's ServiceAccount")
	}
	if role := sa.Annotations[consts.AnnotationRoleARN]; role != "" {
		return role, nil
	}
	return sa.Annotations[consts.AnnotationEKSRoleARN], nil
}
