package framework

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

const (
	// k8sVersion is the version hack/tools/k8s builds; keep it in step with hack/make/20-harness.mk.
	k8sVersion = "v1.37.2"
	// BinDirEnv overrides where the Kubernetes binaries are looked up.
	BinDirEnv = "CISTERN_K8S_BIN"
)

// controlPlaneBinaries are what `make k8s-tools` builds and StartControlPlane needs.
var controlPlaneBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"}

// BinDir returns the directory holding the Kubernetes binaries built by `make k8s-tools`:
// $CISTERN_K8S_BIN if set, else $CISTERN_CACHE/k8s-<version>/bin (CISTERN_CACHE defaults to
// ~/.cache/cistern). When they are missing it skips the test, or fails it when CI=true, so
// that a CI run cannot pass by skipping.
func BinDir(t testing.TB) string {
	t.Helper()
	dir, err := findBinDir()
	if err != nil {
		missing(t, err)
	}
	return dir
}

// Binary returns the path of one binary in BinDir, e.g. "kubectl" or "kubelet".
func Binary(t testing.TB, name string) string {
	t.Helper()
	path := filepath.Join(BinDir(t), name)
	if _, err := os.Stat(path); err != nil {
		hint := "make k8s-tools"
		if name == "kubelet" {
			hint = "make kubelet-tools"
		}
		missing(t, fmt.Errorf("%s not found (%w); run `%s`", name, err, hint))
	}
	return path
}

func missing(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("Kubernetes test binaries: %v", err)
	}
	t.Skipf("Kubernetes test binaries: %v", err)
}

// findBinDir resolves the binary directory and checks that the control plane is complete.
func findBinDir() (string, error) {
	dir := os.Getenv(BinDirEnv)
	if dir == "" {
		cache := os.Getenv("CISTERN_CACHE")
		if cache == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", fmt.Errorf("finding the cache directory: %w", err)
			}
			cache = filepath.Join(home, ".cache", "cistern")
		}
		dir = filepath.Join(cache, "k8s-"+k8sVersion, "bin")
	}
	for _, name := range controlPlaneBinaries {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("%s not found in %s; run `make k8s-tools` (or set %s)", name, dir, BinDirEnv)
		}
	}
	return dir, nil
}
