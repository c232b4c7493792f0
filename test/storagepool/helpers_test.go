package storagepool_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/poolpublisher"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testutil"
)

const (
	// sidecarNamespace and sidecarServiceAccount are those of deploy/csi/storagepool-sidecar.
	sidecarNamespace      = "cistern-system"
	sidecarServiceAccount = "cistern-storagepool-sidecar"
	// waitTimeout bounds every wait for the sidecar or the driver to act.
	waitTimeout = 60 * time.Second
)

var installOnce sync.Once

// install applies the StoragePool CRD and the sidecar's RBAC from deploy/csi, once per package.
func install(t testing.TB, cp *framework.ControlPlane) {
	t.Helper()
	installOnce.Do(func() {
		framework.ApplyYAML(t, cp, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: "+sidecarNamespace+"\n")
		framework.ApplyManifests(t, cp, filepath.Join(framework.RepoRoot(), "deploy/csi/crds/storagepool.storage.k8s.io_storagepools.yaml"),
			filepath.Join(framework.RepoRoot(), "deploy/csi/storagepool-sidecar/rbac.yaml"))
	})
}

// adminClient reads StoragePools as admin, to check what the sidecar wrote.
func adminClient(t *testing.T, cp *framework.ControlPlane) *poolpublisher.Client {
	t.Helper()
	c, err := poolpublisher.NewClient(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// uniqueNode returns a node name no other test uses: objects are cluster-scoped.
func uniqueNode(t *testing.T, suffix string) string {
	name := strings.ToLower(regexp.MustCompile(`[^a-zA-Z0-9]+`).ReplaceAllString(t.Name(), "-"))
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	return strings.Trim(name, "-") + "-" + suffix
}

// poolDir is a pool directory on its own small tmpfs, so capacity and read-only are real.
func poolDir(t *testing.T, sizeMiB int) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%dm", sizeMiB)); err != nil {
		testutil.Unavailable(t, "mounting a tmpfs for a pool needs root: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	return dir
}

type poolConfig struct {
	name   string
	path   string
	shared bool
	labels map[string]string
}

// driver is a running csi-driver binary.
type driver struct {
	node   string
	socket string
	config string
	proc   *framework.Process
	t      *testing.T
	// args are extra flags of the driver.
	args []string
}

func writePoolsConfig(t *testing.T, path string, pools []poolConfig) {
	t.Helper()
	var b strings.Builder
	b.WriteString("pools:\n")
	for _, p := range pools {
		fmt.Fprintf(&b, "- name: %s\n  path: %s\n", p.name, p.path)
		if p.shared {
			b.WriteString("  shared: true\n")
		}
		if len(p.labels) > 0 {
			b.WriteString("  labels:\n")
			for k, v := range p.labels {
				fmt.Fprintf(&b, "    %s: %s\n", k, v)
			}
		}
	}
	// Write then rename, so the driver never reads half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// startDriver runs the real csi-driver for node with pools, checking pools every 200ms.
func startDriver(t *testing.T, node string, pools ...poolConfig) *driver {
	t.Helper()
	return startDriverArgs(t, node, nil, pools...)
}

// startDriverArgs is startDriver with extra driver flags.
func startDriverArgs(t *testing.T, node string, args []string, pools ...poolConfig) *driver {
	t.Helper()
	dir := t.TempDir()
	d := &driver{node: node, socket: filepath.Join(dir, "csi.sock"), config: filepath.Join(dir, "pools.yaml"), t: t, args: args}
	writePoolsConfig(t, d.config, pools)
	d.start()
	return d
}

func (d *driver) start() {
	d.t.Helper()
	d.proc = framework.StartCSIDriver(d.t, "csi-driver-"+d.node, filepath.Join(binDir, "csi-driver"), d.socket,
		append([]string{"--node-id=" + d.node, "--mode=node", "--pools-config=" + d.config,
			"--state-dir=" + filepath.Join(filepath.Dir(d.config), "state"), "--pool-check-interval=200ms", "-v=4"}, d.args...)...)
}

func (d *driver) setPools(pools ...poolConfig) { writePoolsConfig(d.t, d.config, pools) }

// sidecar is a running storagepool-sidecar binary.
type sidecar struct {
	t           testing.TB // fails on a series the sidecar does not export
	proc        *framework.Process
	metricsAddr string
}

// startSidecar runs the real sidecar next to d, as the ServiceAccount of deploy/csi.
func startSidecar(t *testing.T, cp *framework.ControlPlane, d *driver, extra ...string) *sidecar {
	t.Helper()
	install(t, cp)
	kubeconfig := framework.ServiceAccountKubeconfig(t, cp, sidecarNamespace, sidecarServiceAccount)
	addr := framework.FreeAddr(t)
	args := append([]string{
		"--csi-address=" + d.socket, "--kubeconfig=" + kubeconfig, "--node-name=" + d.node,
		"--http-endpoint=" + addr, "--resync-period=2s", "-v=4",
	}, extra...)
	p := framework.StartProcess(t, "storagepool-sidecar-"+d.node, filepath.Join(binDir, "storagepool-sidecar"), args...)
	return &sidecar{t: t, proc: p, metricsAddr: addr}
}

// metric returns the sum of a metric's samples whose labels contain match, from the sidecar's
// /metrics; -1 when the endpoint does not answer. A series the sidecar does not export is a
// failure, never 0: the sidecar exports every label value from its start.
func (s *sidecar) metric(name, match string) float64 {
	resp, err := http.Get("http://" + s.metricsAddr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return -1
	}
	v, ok := sumMetric(string(body), name, match)
	if !ok {
		s.t.Errorf("the sidecar's /metrics has no %s{%s}", name, match)
		return -1
	}
	return v
}

// sumMetric sums the samples of name whose labels contain match; false when there is none.
func sumMetric(text, name, match string) (float64, bool) {
	var sum float64
	found := false
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name) || !strings.Contains(line, match) {
			continue
		}
		rest := strings.TrimPrefix(line, name)
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err == nil {
			sum += v
			found = true
		}
	}
	return sum, found
}

// waitFor is framework.Eventually for a condition that holds or not.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	framework.Eventually(t, waitTimeout, what, func(context.Context) error {
		if cond() {
			return nil
		}
		return errors.New("not yet")
	})
}

// waitPool waits until the object exists and cond holds for it, and returns it.
func waitPool(t *testing.T, c *poolpublisher.Client, name, what string, cond func(*spapi.StoragePool) bool) *spapi.StoragePool {
	t.Helper()
	var last *spapi.StoragePool
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, waitTimeout, true,
		func(ctx context.Context) (bool, error) {
			obj, err := c.Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			last = obj
			return cond(obj), nil
		})
	if err != nil {
		t.Fatalf("waiting for StoragePool %s: %s: %v; last seen: %+v", name, what, err, last)
	}
	return last
}

func waitGone(t *testing.T, c *poolpublisher.Client, name string) {
	t.Helper()
	waitFor(t, "StoragePool "+name+" to be deleted", func() bool {
		_, err := c.Get(context.Background(), name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

func healthyCondition(obj *spapi.StoragePool) metav1.Condition {
	for _, c := range obj.Status.Conditions {
		if c.Type == spapi.ConditionHealthy {
			return c
		}
	}
	return metav1.Condition{}
}

// canI asks the API server whether cfg's user may do verb on resource (cluster-wide).
func canI(t *testing.T, cfg *rest.Config, verb, group, resource string) bool {
	t.Helper()
	res, sub, _ := strings.Cut(resource, "/")
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(context.Background(), &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: verb, Group: group, Resource: res, Subresource: sub,
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Status.Allowed
}

// restartWritesNothing replaces the sidecar sc by a new one for d, started for owner (whose end
// stops it), and checks that once it has synced three times (several resyncs and the driver's watch
// stream have run by then) it has made no API write and left the StoragePool name as it was. It
// returns the new sidecar.
func restartWritesNothing(t, owner *testing.T, cp *framework.ControlPlane, c *poolpublisher.Client, d *driver, sc *sidecar, name string) *sidecar {
	t.Helper()
	before, err := c.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sc.proc.Stop()
	sc = startSidecar(owner, cp, d)
	waitFor(t, "three syncs of the new sidecar", func() bool {
		return sc.metric("storagepool_sidecar_syncs_total", `result="success"`) >= 3
	})
	if w := sc.metric("storagepool_sidecar_api_writes_total", ""); w != 0 {
		t.Errorf("the restarted sidecar made %v API writes, want 0", w)
	}
	after, err := c.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != before.ResourceVersion {
		b, _ := json.Marshal(before.Status)
		a, _ := json.Marshal(after.Status)
		t.Errorf("resourceVersion changed from %s to %s; status before %s, after %s", before.ResourceVersion, after.ResourceVersion, b, a)
	}
	return sc
}

// writeFile writes a file of size patterned bytes at path, making its directory.
func writeFile(t *testing.T, path string, size int) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i*7 + size)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
