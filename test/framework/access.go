package framework

import (
	"context"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ServiceAccountMay asks the API server, with a SubjectAccessReview, whether the ServiceAccount
// namespace/name may do what attrs describe: RBAC tests check deploy/'s roles with it, neither more
// nor less than the components need.
func ServiceAccountMay(t TB, cp *ControlPlane, namespace, name string, attrs authorizationv1.ResourceAttributes) bool {
	t.Helper()
	review, err := cp.Client.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:" + namespace + ":" + name,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
			ResourceAttributes: &attrs,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return review.Status.Allowed
}
