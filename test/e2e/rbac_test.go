package e2e_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/test/e2e/cluster"
	"github.com/cistern-csi/cistern/test/framework"
)

// rbac: the node ServiceAccount, which the provisioner and sidecar run as, has what they need and
// not more; the scenarios above already showed that what they need is enough.
func (s *scenario) rbac(t *testing.T) {
	for _, tc := range []struct {
		verb, group, resource, namespace string
		want                             bool
	}{
		{"create", "", "persistentvolumes", "", true},
		{"create", "storage.k8s.io", "csistoragecapacities", cluster.Namespace, true},
		{"patch", "storagepool.storage.k8s.io", "storagepools", "", true},
		{"create", "authentication.k8s.io", "tokenreviews", "", true},
		{"create", "authorization.k8s.io", "subjectaccessreviews", "", true}, // the metrics port's check of its scrapers
		{"create", "storage.k8s.io", "csistoragecapacities", "default", false},
		{"get", "", "secrets", "default", false},
		{"get", "", "secrets", cluster.Namespace, false},
		{"update", "", "nodes", "", false},
		{"patch", "", "nodes", "", true}, // --remove-startup-taint; held to its own Node by cistern-node-startup-taint
		{"delete", "", "nodes", "", false},
		{"delete", "", "pods", cluster.Namespace, false},
		{"create", "apps", "daemonsets", cluster.Namespace, false},
	} {
		if got := framework.ServiceAccountMay(t, s.cp, cluster.Namespace, cluster.NodeServiceAccount, authorizationv1.ResourceAttributes{
			Verb: tc.verb, Group: tc.group, Resource: tc.resource, Namespace: tc.namespace,
		}); got != tc.want {
			t.Errorf("%s may %s %s.%s in %q: %v, want %v", cluster.NodeServiceAccount, tc.verb, tc.resource, tc.group, tc.namespace, got, tc.want)
		}
	}
}

// nodeEventsRole: the driver's own Events permission is a Role in "default", where Events about
// its Node live, not a ClusterRole (deploy/csi/driver/rbac.yaml).
func (s *scenario) nodeEventsRole(t *testing.T) {
	c := ctx(t)
	if _, err := s.cp.Client.RbacV1().Roles("default").Get(c, "cistern-node-events", metav1.GetOptions{}); err != nil {
		t.Errorf("Role default/cistern-node-events: %v", err)
	}
	if _, err := s.cp.Client.RbacV1().RoleBindings("default").Get(c, "cistern-node-events", metav1.GetOptions{}); err != nil {
		t.Errorf("RoleBinding default/cistern-node-events: %v", err)
	}
	if _, err := s.cp.Client.RbacV1().ClusterRoles().Get(c, "cistern-node-events", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a cluster-wide cistern-node-events ClusterRole: %v", err)
	}
}

// controllerRBAC: the workload-controller reads and renews its own webhook certificate Secret and
// leader-election Lease by name, and no other Secret.
func (s *scenario) controllerRBAC(t *testing.T) {
	for _, tc := range []struct {
		verb, group, resource, name string
		want                        bool
	}{
		{"get", "", "secrets", "cistern-workload-webhook-cert", true},
		{"update", "", "secrets", "cistern-workload-webhook-cert", true},
		{"get", "", "secrets", "another-tenant-secret", false},
		{"list", "", "secrets", "", false},
		{"update", "coordination.k8s.io", "leases", "workload-controller.cistern.dev", true},
		{"update", "coordination.k8s.io", "leases", "kube-scheduler", false},
		// The pod placement webhook: reads classes and lists StoragePools, writes neither.
		{"get", "storage.k8s.io", "storageclasses", "", true},
		{"update", "storage.k8s.io", "storageclasses", "", false},
		{"list", consts.StoragePoolGroup, "storagepools", "", true},
		{"update", consts.StoragePoolGroup, "storagepools", "", false},
	} {
		if got := framework.ServiceAccountMay(t, s.cp, cluster.Namespace, cluster.ControllerServiceAccount, authorizationv1.ResourceAttributes{
			Verb: tc.verb, Group: tc.group, Resource: tc.resource, Namespace: cluster.Namespace, Name: tc.name,
		}); got != tc.want {
			t.Errorf("%s may %s %s.%s %q: %v, want %v", cluster.ControllerServiceAccount, tc.verb, tc.resource, tc.group, tc.name, got, tc.want)
		}
	}
}

// controllerMetrics: the workload-controller serves /metrics only to callers whose token may GET
// it (deploy/csi's cistern-metrics-reader), over HTTPS.
func (s *scenario) controllerMetrics(t *testing.T) {
	if s.c.ControllerMetrics == "" {
		t.Fatal("the workload-controller runs without metrics")
	}
	c := ctx(t)
	const scraper = "metrics-scraper"
	if _, err := s.cp.Client.CoreV1().ServiceAccounts(s.ns).Create(c, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: scraper}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "cistern-e2e-metrics-scraper"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: scraper, Namespace: s.ns}},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cistern-metrics-reader"},
	}
	if _, err := s.cp.Client.RbacV1().ClusterRoleBindings().Create(c, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.cp.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
	get := func(token string) (int, string) {
		req, _ := http.NewRequestWithContext(c, http.MethodGet, s.c.ControllerMetrics, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		// The controller's serving certificate is self-signed: this checks who may read, not TLS.
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get(""); code != http.StatusUnauthorized {
		t.Errorf("anonymous: HTTP %d, want 401", code)
	}
	other := framework.ServiceAccountConfig(t, s.cp, cluster.Namespace, cluster.NodeServiceAccount).BearerToken
	if code, _ := get(other); code != http.StatusForbidden {
		t.Errorf("a ServiceAccount without cistern-metrics-reader: HTTP %d, want 403", code)
	}
	token := framework.ServiceAccountConfig(t, s.cp, s.ns, scraper).BearerToken
	eventually(t, time.Minute, "the scraper reads metrics", func(context.Context) error {
		if code, body := get(token); code != http.StatusOK || !strings.Contains(body, "controller_runtime_reconcile_total") {
			return fmt.Errorf("HTTP %d: %.200s", code, body)
		}
		return nil
	})
}
