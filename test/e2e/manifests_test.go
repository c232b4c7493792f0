package e2e_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/cistern-csi/cistern/test/e2e/cluster"
	"github.com/cistern-csi/cistern/test/framework"
)

// deployDryRun: the API server accepts everything deploy/csi installs (schemas, RBAC references,
// CRDs) without installing it, with server-side apply as the docs say and with the plain
// client-side apply. TestE2E runs it before installing: on installed objects the two appliers
// would conflict over fields they both own.
func deployDryRun(t *testing.T, cp *framework.ControlPlane) {
	t.Helper()
	out := framework.Kubectl(t, cp, "apply", "--server-side", "--dry-run=server", "--field-manager=cistern-e2e", "-k", cluster.DeployDir())
	t.Logf("kubectl apply --server-side --dry-run=server -k deploy/csi:\n%s", out)
	for _, want := range []string{
		"csidriver.storage.k8s.io/cistern.csi.dev",
		"daemonset.apps/cistern-node",
		"clusterrole.rbac.authorization.k8s.io/cistern-csi-provisioner",
		"configmap/cistern-pools",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run did not list %s", want)
		}
	}
	framework.Kubectl(t, cp, "apply", "--dry-run=server", "-k", cluster.DeployDir())
}

// TestKustomizationsBuild: the examples and the pools-profile overlay build, and the base
// includes every component directory under deploy/csi, so `apply -k deploy/csi` installs all.
func TestKustomizationsBuild(t *testing.T) {
	cp := framework.Shared(t)
	for _, dir := range []string{"", "examples", "examples/pools-profile"} {
		out := framework.Kubectl(t, cp, "kustomize", filepath.Join(cluster.DeployDir(), dir))
		if !strings.Contains(out, "kind:") {
			t.Errorf("kubectl kustomize deploy/csi/%s: no objects", dir)
		}
	}
	data, err := os.ReadFile(filepath.Join(cluster.DeployDir(), "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(cluster.DeployDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		included := slices.ContainsFunc(k.Resources, func(r string) bool {
			return r == e.Name() || strings.HasPrefix(r, e.Name()+"/")
		})
		if e.IsDir() && e.Name() != "examples" && !included {
			t.Errorf("deploy/csi/kustomization.yaml does not include %s/", e.Name())
		}
	}
}
