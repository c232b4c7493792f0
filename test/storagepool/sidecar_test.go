package storagepool_test

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/test/framework"
)

// TestPoolLifecycle follows two pools of one node through the real driver and sidecar: they
// appear with the KEP's fields, capacity changes propagate, a read-only pool turns unhealthy with
// an error, a pool removed from the driver's config is deleted, and a restarted sidecar leaves
// the objects alone.
func TestPoolLifecycle(t *testing.T) {
	cp := framework.Shared(t)
	c := adminClient(t, cp)
	node := uniqueNode(t, "n1")
	fast := poolConfig{name: "fast", path: poolDir(t, 64), labels: map[string]string{"media": "ssd"}}
	slow := poolConfig{name: "slow", path: poolDir(t, 32)}
	d := startDriver(t, node, fast, slow)
	sc := startSidecar(t, cp, d)

	fastName, slowName := "fast."+node, "slow."+node
	parent := t
	obj := waitPool(t, c, fastName, "published and healthy", func(o *spapi.StoragePool) bool {
		return healthyCondition(o).Status == metav1.ConditionTrue && o.Status.Capacity != nil
	})
	t.Run("objects have the KEP fields", func(t *testing.T) {
		if obj.Spec.Driver != consts.DriverName || obj.Spec.Parameters[consts.ParamPool] != "fast" {
			t.Errorf("spec = %+v", obj.Spec)
		}
		if !slices.Equal(obj.Status.AccessibleNodes, []string{node}) {
			t.Errorf("accessibleNodes = %v, want [%s]", obj.Status.AccessibleNodes, node)
		}
		if total := obj.Status.Capacity.Total.Value(); total != 64<<20 {
			t.Errorf("capacity.total = %d, want the tmpfs size %d", total, 64<<20)
		}
		if obj.Status.Capacity.Available == nil || obj.Status.Capacity.Available.Value() <= 0 {
			t.Errorf("capacity.available = %v", obj.Status.Capacity.Available)
		}
		want := map[string]string{consts.LabelPool: "fast", consts.LabelNode: node, "media": "ssd"}
		for k, v := range want {
			if obj.Labels[k] != v {
				t.Errorf("label %s = %q, want %q", k, obj.Labels[k], v)
			}
		}
		waitPool(t, c, slowName, "published", func(*spapi.StoragePool) bool { return true })
		out := framework.Kubectl(t, cp, "get", "storagepools", fastName)
		for _, col := range []string{"DRIVER", "NODES", "TOTAL", "AVAILABLE", "HEALTHY", "AGE", consts.DriverName, "64.0 MiB", "True"} {
			if !strings.Contains(out, col) {
				t.Errorf("kubectl get storagepools lacks %q:\n%s", col, out)
			}
		}
	})

	t.Run("capacity changes propagate", func(t *testing.T) {
		before := obj.Status.Capacity.Available.Value()
		writeFile(t, filepath.Join(fast.path, "filler"), 16<<20)
		waitPool(t, c, fastName, "available capacity to drop by 16Mi", func(o *spapi.StoragePool) bool {
			return o.Status.Capacity.Available.Value() <= before-16<<20
		})
	})

	t.Run("a read-only pool is unhealthy and shows the error", func(t *testing.T) {
		if err := unix.Mount("", fast.path, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			t.Fatalf("remounting read-only: %v", err)
		}
		obj := waitPool(t, c, fastName, "Healthy=False", func(o *spapi.StoragePool) bool {
			return healthyCondition(o).Status == metav1.ConditionFalse
		})
		if cond := healthyCondition(obj); cond.Reason != spapi.ReasonPoolUnhealthy || !strings.Contains(cond.Message, "read-only") {
			t.Errorf("Healthy = %+v", cond)
		}
		if n := len(obj.Status.Errors); n == 0 || !strings.Contains(obj.Status.Errors[n-1].Message, "read-only") {
			t.Errorf("errors = %+v, want the read-only error last", obj.Status.Errors)
		}
		if err := unix.Mount("", fast.path, "", unix.MS_REMOUNT, ""); err != nil {
			t.Fatalf("remounting read-write: %v", err)
		}
		waitPool(t, c, fastName, "Healthy=True again", func(o *spapi.StoragePool) bool {
			return healthyCondition(o).Status == metav1.ConditionTrue
		})
	})

	t.Run("a pool removed from the config is deleted", func(t *testing.T) {
		d.setPools(fast)
		waitGone(t, c, slowName)
		if _, err := c.Get(context.Background(), fastName, metav1.GetOptions{}); err != nil {
			t.Errorf("the remaining pool: %v", err)
		}
	})

	t.Run("a restarted sidecar does not rewrite objects", func(t *testing.T) {
		// Let the driver and the sidecar settle: two resyncs without a write.
		waitFor(t, "a quiet sidecar", func() bool {
			w := sc.metric("storagepool_sidecar_api_writes_total", "")
			time.Sleep(4500 * time.Millisecond)
			return w >= 0 && sc.metric("storagepool_sidecar_api_writes_total", "") == w
		})
		// Started for the parent test: the next subtests need it running.
		sc = restartWritesNothing(t, parent, cp, c, d, sc, fastName)
	})

	t.Run("an unreachable driver deletes nothing", func(t *testing.T) {
		d.proc.Stop()
		obj := waitPool(t, c, fastName, "Healthy=Unknown", func(o *spapi.StoragePool) bool {
			return healthyCondition(o).Status == metav1.ConditionUnknown
		})
		if cond := healthyCondition(obj); cond.Reason != spapi.ReasonDriverUnreachable {
			t.Errorf("Healthy = %+v", cond)
		}
		if n := len(obj.Status.Errors); n == 0 || !strings.Contains(obj.Status.Errors[n-1].Message, "driver unreachable") {
			t.Errorf("errors = %+v", obj.Status.Errors)
		}
		d.start()
		waitPool(t, c, fastName, "Healthy=True after the driver came back", func(o *spapi.StoragePool) bool {
			return healthyCondition(o).Status == metav1.ConditionTrue
		})
	})

	t.Run("a deleted object is re-created", func(t *testing.T) {
		before, err := c.Get(context.Background(), fastName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Delete(context.Background(), fastName, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPool(t, c, fastName, "re-created with its status", func(o *spapi.StoragePool) bool {
			return o.UID != before.UID && healthyCondition(o).Status == metav1.ConditionTrue
		})
	})
}

// TestSharedPool runs two nodes' drivers and sidecars with one shared pool: one object lists both
// nodes, and stays there when one node stops reporting it.
func TestSharedPool(t *testing.T) {
	cp := framework.Shared(t)
	c := adminClient(t, cp)
	dir := poolDir(t, 64)
	poolName := uniqueNode(t, "nfs")
	shared := poolConfig{name: poolName, path: dir, shared: true}
	na, nb := uniqueNode(t, "a"), uniqueNode(t, "b")
	da := startDriver(t, na, shared, poolConfig{name: "local", path: poolDir(t, 16)})
	db := startDriver(t, nb, shared)
	sa := startSidecar(t, cp, da)
	sb := startSidecar(t, cp, db)

	want := []string{na, nb}
	slices.Sort(want)
	obj := waitPool(t, c, poolName, "both nodes", func(o *spapi.StoragePool) bool {
		// A set in the order the nodes joined.
		return slices.Equal(slices.Sorted(slices.Values(o.Status.AccessibleNodes)), want)
	})
	if obj.Labels[consts.LabelShared] != "true" || obj.Labels[consts.LabelNode] != "" {
		t.Errorf("labels = %v", obj.Labels)
	}
	waitPool(t, c, "local."+na, "the node-local pool next to it", func(*spapi.StoragePool) bool { return true })

	// Both sidecars resync every 2s: the object must not flap between their views. Counted, not
	// slept: three more successful syncs of each sidecar.
	rv := obj.ResourceVersion
	syncsA := sa.metric("storagepool_sidecar_syncs_total", `result="success"`)
	syncsB := sb.metric("storagepool_sidecar_syncs_total", `result="success"`)
	waitFor(t, "three more syncs of each sidecar", func() bool {
		return sa.metric("storagepool_sidecar_syncs_total", `result="success"`) >= syncsA+3 &&
			sb.metric("storagepool_sidecar_syncs_total", `result="success"`) >= syncsB+3
	})
	if now, err := c.Get(context.Background(), poolName, metav1.GetOptions{}); err != nil || now.ResourceVersion != rv {
		t.Errorf("the shared pool was rewritten while nothing changed (resourceVersion %s -> %s, err %v)", rv, now.ResourceVersion, err)
	}

	db.setPools()
	waitPool(t, c, poolName, "only node a", func(o *spapi.StoragePool) bool {
		return slices.Equal(o.Status.AccessibleNodes, []string{na})
	})
	da.setPools(poolConfig{name: "local", path: poolDir(t, 16)})
	waitGone(t, c, poolName)
}

// TestSidecarRBAC checks that the ServiceAccount the sidecars run as holds what deploy/csi
// grants and nothing more: the other tests prove it is enough.
func TestSidecarRBAC(t *testing.T) {
	cp := framework.Shared(t)
	install(t, cp)
	cfg := framework.ServiceAccountConfig(t, cp, sidecarNamespace, sidecarServiceAccount)
	for _, tc := range []struct {
		verb, group, resource string
		want                  bool
	}{
		{"patch", spapi.SchemeGroupVersion.Group, "storagepools", true},
		{"delete", spapi.SchemeGroupVersion.Group, "storagepools", true},
		{"patch", spapi.SchemeGroupVersion.Group, "storagepools/status", true},
		{"get", "", "nodes", false},
		{"list", "", "secrets", false},
		{"create", "", "pods", false},
		{"delete", "apiextensions.k8s.io", "customresourcedefinitions", false},
	} {
		if got := canI(t, cfg, tc.verb, tc.group, tc.resource); got != tc.want {
			t.Errorf("can %s %s.%s = %v, want %v", tc.verb, tc.resource, tc.group, got, tc.want)
		}
	}
}
