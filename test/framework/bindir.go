package framework

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

const (
	// k8sVersion is the version hack/tools/k8s builds; keep it in step with hack/make/20-harness.mk.
	k8sVersion = "v1.37.2"
	// BinDirEnv overrides where the Kubernetes binaries are looked up.
	BinDirEnv = "CISTERN_K8S_BIN"

	// externalProvisionerVersion is what hack/tools/csi builds (`make csi-tools`).
	externalProvisionerVersion = "v6.4.0"
	// CSIBinDirEnv overrides where csi-provisioner is looked up.
	CSIBinDirEnv = "CISTERN_CSI_BIN"
)

// errBinariesMissing means `make k8s-tools` has not been run.
var errBinariesMissing = errors.New("missing Kubernetes test binaries")

// controlPlaneBinaries are what `make k8s-tools` builds and StartControlPlane needs.
var controlPlaneBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"}

// BinDir returns the directory holding the Kubernetes binaries built by `make k8s-tools`:
// $CISTERN_K8S_BIN if set, else $CISTERN_CACHE/k8s-<version>/bin (CISTERN_CACHE defaults to
// ~/.cache/cistern). When they are missing it skips the test, or fails it when CI=true, so
// that a CI run cannot pass by skipping.
func BinDir(t TB) string {
	t.Helper()
	return orMissing(t, findBinDir)
}

// Binary returns the path of one binary in BinDir, e.g. "kubectl" or "kubelet".
func Binary(t TB, name string) string {
	t.Helper()
	path := filepath.Join(BinDir(t), name)
	if _, err := os.Stat(path); err != nil {
		hint := "make k8s-tools"
		if name == "kubelet" {
			hint = "make kubelet-tools"
		}
		missing(t, fmt.Errorf("%w: %s (run `%s`)", errBinariesMissing, err, hint))
	}
	return path
}

// missing skips the test for want of built binaries, or fails it under CI=true (and outside go
// test, where there is no skipping).
func missing(t TB, err error) {
	t.Helper()
	if s, ok := t.(interface{ Skip(...any) }); ok && os.Getenv("CI") != "true" {
		s.Skip(err)
	}
	t.Fatal(err)
}

// findBinDir resolves the binary directory and checks that the control plane is complete.
func findBinDir() (string, error) {
	dir, err := ToolDir(BinDirEnv, "k8s-"+k8sVersion)
	if err != nil {
		return "", err
	}
	for _, name := range controlPlaneBinaries {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("%w: %s not found in %s; run `make k8s-tools` (or set %s)", errBinariesMissing, name, dir, BinDirEnv)
		}
	}
	return dir, nil
}

// ExternalProvisioner returns the path of the csi-provisioner built by `make csi-tools`.
// Missing, it skips the test (fails it when CI=true).
func ExternalProvisioner(t TB) string {
	t.Helper()
	return orMissing(t, ExternalProvisionerPath)
}

// orMissing is the path find returns, or the test skipped (failed under CI=true) with its error.
func orMissing(t TB, find func() (string, error)) string {
	t.Helper()
	path, err := find()
	if err != nil {
		missing(t, err)
	}
	return path
}

// ExternalProvisionerPath is $CISTERN_CSI_BIN/csi-provisioner, else
// $CISTERN_CACHE/external-provisioner-<version>/bin/csi-provisioner, for callers without a test
// (the demo); the error says how to build it.
func ExternalProvisionerPath() (string, error) {
	dir, err := ToolDir(CSIBinDirEnv, "external-provisioner-"+externalProvisionerVersion)
	if err != nil {
		return "", fmt.Errorf("%w: %v", errBinariesMissing, err)
	}
	path := filepath.Join(dir, "csi-provisioner")
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%w: csi-provisioner not found in %s; run `make csi-tools` (or set %s)", errBinariesMissing, dir, CSIBinDirEnv)
	}
	return path, nil
}

// ToolDir is $<env> if set, else <CISTERN_CACHE>/<name>/bin (CISTERN_CACHE defaults to
// ~/.cache/cistern, as in the Makefile): where the tool builds of the Makefile put their output.
func ToolDir(env, name string) (string, error) {
	if dir := os.Getenv(env); dir != "" {
		return dir, nil
	}
	cache := os.Getenv("CISTERN_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("finding the cache directory: %w", err)
		}
		cache = filepath.Join(home, ".cache", "cistern")
	}
	return filepath.Join(cache, name, "bin"), nil
}
