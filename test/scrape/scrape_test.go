// Package scrape checks that a real Prometheus scrapes Cistern's components: the node plugin
// (cmd/csi-driver --metrics-secure-address, HTTPS for a token allowed to get /metrics, checked by
// a real API server) and the storagepool-sidecar, started as the real binaries on the loopback,
// each target up and a series of its own in Prometheus' query results. The chart's Services and
// ServiceMonitors (metrics.serviceMonitor) point a Prometheus of the cluster at the same
// endpoints; test/chart checks those objects.
package scrape

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

func TestMain(m *testing.M) {
	os.Exit(framework.RunShared(m, framework.Options{}))
}

// TestPrometheusScrapes: up == 1 for the node plugin (scraped with the token of a ServiceAccount
// bound to deploy/csi's cistern-metrics-reader, the plugin running as deploy/csi's node
// ServiceAccount) and the sidecar, cistern_pool_healthy of the node plugin's pool and the
// sidecar's storagepool_sidecar_syncs_total in query results; the same endpoint scraped without a
// token is down.
func TestPrometheusScrapes(t *testing.T) {
	cp := framework.Shared(t)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "prometheus-token")
	write(t, tokenFile, scraperToken(t, cp))
	if out, err := testutil.GoBuild(dir+"/", "../../cmd/csi-driver", "../../cmd/storagepool-sidecar").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	pool, sock := filepath.Join(dir, "pool"), filepath.Join(dir, "csi.sock")
	if err := os.Mkdir(pool, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "pools.yaml"), "pools:\n- name: fast\n  path: "+pool+"\n")
	// An API server nobody listens at for the sidecar: it serves its metrics, its publishing waits.
	kubeconfig := filepath.Join(dir, "kubeconfig")
	write(t, kubeconfig, `{"apiVersion": "v1", "kind": "Config", "current-context": "c",
  "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
  "users": [{"name": "u", "user": {"token": "x"}}],
  "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}`)
	driverAddr, sidecarAddr := testpeers.FreeAddr(t), testpeers.FreeAddr(t)
	start(t, filepath.Join(dir, "csi-driver"), "--endpoint=unix://"+sock, "--node-id=n1",
		"--pools-config="+filepath.Join(dir, "pools.yaml"), "--state-dir="+filepath.Join(dir, "state"),
		"--writeback-dir=", "--kubeconfig="+framework.ServiceAccountKubeconfig(t, cp, "cistern-system", "cistern-node"),
		"--metrics-secure-address="+driverAddr)
	start(t, filepath.Join(dir, "storagepool-sidecar"), "--csi-address="+sock, "--node-name=n1",
		"--kubeconfig="+kubeconfig, "--http-endpoint="+sidecarAddr)
	prom := testpeers.StartPrometheus(t, dir, map[string]testpeers.Target{
		"cistern-node":           {Addr: driverAddr, HTTPS: true, TokenFile: tokenFile},
		"cistern-node-anonymous": {Addr: driverAddr, HTTPS: true},
		"storagepool-sidecar":    {Addr: sidecarAddr},
	})

	for _, q := range []string{
		`up{job="cistern-node"} == 1`,
		`up{job="storagepool-sidecar"} == 1`,
		`cistern_pool_healthy{job="cistern-node", node="n1", pool="fast"} == 1`,
		`storagepool_sidecar_syncs_total{job="storagepool-sidecar"}`,
		`up{job="cistern-node-anonymous"} == 0`,
	} {
		s := await(t, prom, q)
		t.Logf("%s: %v", q, s[0].Metric)
	}
}

// scraperToken installs deploy/csi's node ServiceAccount and its RBAC and cistern-metrics-reader,
// and returns the token of a ServiceAccount bound to cistern-metrics-reader, as a cluster's
// Prometheus would hold.
func scraperToken(t *testing.T, cp *framework.ControlPlane) string {
	t.Helper()
	framework.ApplyYAML(t, cp, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: cistern-system\n")
	root := framework.RepoRoot()
	framework.ApplyManifests(t, cp, filepath.Join(root, "deploy/csi/driver/rbac.yaml"),
		filepath.Join(root, "deploy/csi/workload-controller/metrics-reader.yaml"))
	ctx := context.Background()
	if _, err := cp.Client.CoreV1().ServiceAccounts("cistern-system").Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "prometheus"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheus-cistern-metrics"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "prometheus", Namespace: "cistern-system"}},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cistern-metrics-reader"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return framework.ServiceAccountConfig(t, cp, "cistern-system", "prometheus").BearerToken
}

// await polls Prometheus until query q has a result, for at most two minutes.
func await(t *testing.T, prom *testpeers.Prometheus, q string) []testpeers.Sample {
	t.Helper()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(2 * time.Minute)
	var last error
	for {
		s, err := prom.Query(t, q)
		if err == nil && len(s) > 0 {
			return s
		}
		last = err
		select {
		case <-tick.C:
		case <-deadline:
			targets, _ := prom.Query(t, "up")
			t.Fatalf("no result for %s in two minutes (last error %v; up: %v)", q, last, targets)
		}
	}
}

// start runs bin with args until the test ends; its output is logged if the test fails.
func start(t *testing.T, bin string, args ...string) {
	t.Helper()
	var out strings.Builder
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s:\n%s", filepath.Base(bin), out.String())
		}
	})
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
