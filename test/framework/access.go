package framework

import (
	"context"
	"os"
	"path/filepath"
	"strings"

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

// GrantNodeRole creates the node plugin's ServiceAccount (cistern-system/cistern-node) holding
// only the ClusterRole role and its ClusterRoleBinding of the same name, as deploy/csi's
// driver/rbac.yaml writes them, so a test acts with exactly what that grant gives.
func GrantNodeRole(t TB, cp *ControlPlane, role string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(RepoRoot(), "deploy", "csi", "driver", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs := []string{"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: cistern-system",
		"apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: cistern-node\n  namespace: cistern-system"}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		if strings.Contains(doc, "name: "+role) {
			docs = append(docs, doc)
		}
	}
	if len(docs) != 4 {
		t.Fatalf("deploy/csi/driver/rbac.yaml: want the ClusterRole and ClusterRoleBinding %s, found %d documents", role, len(docs)-2)
	}
	ApplyYAML(t, cp, strings.Join(docs, "\n---\n"))
}
