package e2e_test

import (
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cistern-csi/cistern/test/e2e/cluster"
)

// rbac: the node ServiceAccount, which the provisioner and sidecar run as, has what they need and
// not more; the scenarios above already showed that what they need is enough.
func (s *scenario) rbac(t *testing.T) {
	node := "system:serviceaccount:" + cluster.Namespace + ":" + cluster.NodeServiceAccount
	for _, tc := range []struct {
		verb, group, resource, namespace string
		want                             bool
	}{
		{"create", "", "persistentvolumes", "", true},
		{"create", "storage.k8s.io", "csistoragecapacities", cluster.Namespace, true},
		{"patch", "storagepool.storage.k8s.io", "storagepools", "", true},
		{"create", "storage.k8s.io", "csistoragecapacities", "default", false},
		{"get", "", "secrets", "default", false},
		{"get", "", "secrets", cluster.Namespace, false},
		{"update", "", "nodes", "", false},
		{"delete", "", "pods", cluster.Namespace, false},
		{"create", "apps", "daemonsets", cluster.Namespace, false},
	} {
		review, err := s.cp.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx(t), &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User:   node,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + cluster.Namespace, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Verb: tc.verb, Group: tc.group, Resource: tc.resource, Namespace: tc.namespace,
				},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if review.Status.Allowed != tc.want {
			t.Errorf("%s may %s %s.%s in %q: %v, want %v", cluster.NodeServiceAccount, tc.verb, tc.resource, tc.group, tc.namespace, review.Status.Allowed, tc.want)
		}
	}
}
