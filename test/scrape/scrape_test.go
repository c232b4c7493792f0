// Package scrape checks that a real Prometheus scrapes Cistern's components: the node plugin
// (cmd/csi-driver --http-endpoint) and the storagepool-sidecar, started as the real binaries on
// the loopback, each target up and a series of its own in Prometheus' query results. The chart's
// Services and ServiceMonitors (metrics.serviceMonitor) point a Prometheus of the cluster at the
// same endpoints; test/chart checks those objects.
package scrape

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// TestPrometheusScrapes: up == 1 for the node plugin and the sidecar, cistern_pool_healthy of
// the node plugin's pool and the sidecar's storagepool_sidecar_syncs_total in query results.
func TestPrometheusScrapes(t *testing.T) {
	dir := t.TempDir()
	if out, err := testutil.GoBuild(dir+"/", "../../cmd/csi-driver", "../../cmd/storagepool-sidecar").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	pool, sock := filepath.Join(dir, "pool"), filepath.Join(dir, "csi.sock")
	if err := os.Mkdir(pool, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "pools.yaml"), "pools:\n- name: fast\n  path: "+pool+"\n")
	// An API server nobody listens at: the sidecar serves its metrics, its publishing waits.
	kubeconfig := filepath.Join(dir, "kubeconfig")
	write(t, kubeconfig, `{"apiVersion": "v1", "kind": "Config", "current-context": "c",
  "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
  "users": [{"name": "u", "user": {"token": "x"}}],
  "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}`)
	driverAddr, sidecarAddr := testpeers.FreeAddr(t), testpeers.FreeAddr(t)
	start(t, filepath.Join(dir, "csi-driver"), "--endpoint=unix://"+sock, "--node-id=n1",
		"--pools-config="+filepath.Join(dir, "pools.yaml"), "--state-dir="+filepath.Join(dir, "state"),
		"--writeback-dir=", "--kubeconfig="+kubeconfig, "--http-endpoint="+driverAddr)
	start(t, filepath.Join(dir, "storagepool-sidecar"), "--csi-address="+sock, "--node-name=n1",
		"--kubeconfig="+kubeconfig, "--http-endpoint="+sidecarAddr)
	prom := testpeers.StartPrometheus(t, dir, map[string]string{"cistern-node": driverAddr, "storagepool-sidecar": sidecarAddr})

	for _, q := range []string{
		`up{job="cistern-node"} == 1`,
		`up{job="storagepool-sidecar"} == 1`,
		`cistern_pool_healthy{job="cistern-node", node="n1", pool="fast"} == 1`,
		`storagepool_sidecar_syncs_total{job="storagepool-sidecar"}`,
	} {
		s := await(t, prom, q)
		t.Logf("%s: %v", q, s[0].Metric)
	}
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
