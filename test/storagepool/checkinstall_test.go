package storagepool_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/test/framework"
)

// TestCheckInstall runs `csi-driver check-install`, what the chart's `helm test` pod runs, as the
// ServiceAccount and ClusterRole the chart gives that pod (charts/cistern/files/tests): it passes
// once the node that registered the driver (its CSINode, as kubelet writes it) has its pools
// published by the real sidecar, and fails naming a registered node that has none; its role
// reads nothing but what it checks.
func TestCheckInstall(t *testing.T) {
	cp := framework.Shared(t)
	install(t, cp)
	rbac, err := os.ReadFile(filepath.Join(framework.RepoRoot(), "charts/cistern/files/tests/check-install-rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	framework.ApplyYAML(t, cp, string(rbac))
	kubeconfig := framework.ServiceAccountKubeconfig(t, cp, sidecarNamespace, "cistern-check-install")
	kube := kubernetes.NewForConfigOrDie(cp.Config)
	ctx := context.Background()
	if _, err := kube.StorageV1().CSIDrivers().Create(ctx, &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: consts.DriverName}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	registered := func(node string) {
		t.Helper()
		n := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: node},
			Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: consts.DriverName, NodeID: node}}}}
		if _, err := kube.StorageV1().CSINodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = kube.StorageV1().CSINodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	}
	check := func() (string, error) {
		out, err := exec.Command(filepath.Join(binDir, "csi-driver"), "check-install", "--kubeconfig="+kubeconfig).CombinedOutput()
		return string(out), err
	}

	withPools := uniqueNode(t, "a")
	registered(withPools)
	d := startDriver(t, withPools, poolConfig{name: "fast", path: poolDir(t, 16)})
	startSidecar(t, cp, d)
	waitPool(t, adminClient(t, cp), "fast."+withPools, "published", func(*spapi.StoragePool) bool { return true })
	out, err := check()
	if err != nil || !strings.Contains(out, "node "+withPools+": StoragePools fast."+withPools) {
		t.Errorf("check-install with every registered node's pools published: %v, want a pass listing fast.%s:\n%s", err, withPools, out)
	}

	without := uniqueNode(t, "b")
	registered(without)
	out, err = check()
	if err == nil || !strings.Contains(out, "node "+without+" runs "+consts.DriverName+" but has no StoragePool") {
		t.Errorf("check-install with node %s registered and no pool of its own: %v, want a failure naming it:\n%s", without, err, out)
	}

	cfg := framework.ServiceAccountConfig(t, cp, sidecarNamespace, "cistern-check-install")
	for _, tc := range []struct {
		verb, group, resource string
		want                  bool
	}{
		{"list", "storage.k8s.io", "csinodes", true},
		{"list", spapi.SchemeGroupVersion.Group, "storagepools", true},
		{"patch", spapi.SchemeGroupVersion.Group, "storagepools", false},
		{"list", "storage.k8s.io", "csidrivers", false},
		{"get", "", "secrets", false},
		{"list", "", "nodes", false},
	} {
		if got := canI(t, cfg, tc.verb, tc.group, tc.resource); got != tc.want {
			t.Errorf("the check's ServiceAccount can %s %s.%s = %v, want %v", tc.verb, tc.resource, tc.group, got, tc.want)
		}
	}
}
