package storagepool_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cistern-csi/cistern/test/framework"
)

// TestNodeMetricsAuth: the node plugin's --metrics-secure-address, run as deploy/csi's node
// ServiceAccount, serves /metrics over HTTPS only to a caller the API server authenticates and
// authorises for it: no token and a token the API server does not know get 401, a ServiceAccount
// without cistern-metrics-reader 403, one bound to it 200 with the driver's cistern_ series.
func TestNodeMetricsAuth(t *testing.T) {
	cp := framework.Shared(t)
	install(t, cp)
	root := framework.RepoRoot()
	framework.ApplyManifests(t, cp, filepath.Join(root, "deploy/csi/driver/rbac.yaml"),
		filepath.Join(root, "deploy/csi/workload-controller/metrics-reader.yaml"))
	ctx := context.Background()
	for _, sa := range []string{"metrics-scraper", "metrics-nobody"} {
		_, err := cp.Client.CoreV1().ServiceAccounts(sidecarNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "cistern-test-metrics-scraper"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "metrics-scraper", Namespace: sidecarNamespace}},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cistern-metrics-reader"},
	}
	if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})

	addr := framework.FreeAddr(t)
	node := uniqueNode(t, "n")
	startDriverArgs(t, node, []string{"--metrics-secure-address=" + addr,
		"--kubeconfig=" + framework.ServiceAccountKubeconfig(t, cp, sidecarNamespace, "cistern-node")},
		poolConfig{name: "fast", path: poolDir(t, 16)})

	// The certificate is self-signed: this checks who may read, not TLS.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec
	get := func(token string) (int, string, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	scraper := framework.ServiceAccountConfig(t, cp, sidecarNamespace, "metrics-scraper").BearerToken
	framework.Eventually(t, waitTimeout, "the scraper reads the node plugin's metrics", func(context.Context) error {
		code, body, err := get(scraper)
		switch {
		case err != nil:
			return err
		case code != http.StatusOK:
			return fmt.Errorf("HTTP %d: %.200s", code, body)
		case !strings.Contains(body, `cistern_pool_healthy{node="`+node+`",pool="fast"} 1`):
			return fmt.Errorf("no cistern_pool_healthy of pool fast in:\n%.2000s", body)
		}
		return nil
	})
	for _, tc := range []struct {
		name, token string
		want        int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"a token the API server does not know", "not-a-token", http.StatusUnauthorized},
		{"a ServiceAccount without cistern-metrics-reader", framework.ServiceAccountConfig(t, cp, sidecarNamespace, "metrics-nobody").BearerToken, http.StatusForbidden},
		{"the node plugin's own ServiceAccount", framework.ServiceAccountConfig(t, cp, sidecarNamespace, "cistern-node").BearerToken, http.StatusForbidden},
	} {
		code, body, err := get(tc.token)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if code != tc.want || strings.Contains(body, "cistern_") {
			t.Errorf("%s: HTTP %d, want %d: %.200s", tc.name, code, tc.want, body)
		}
	}
}
