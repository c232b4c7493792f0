// Package testutil holds what the workload-controller's suites share.
package testutil

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// InstallCRDs creates the CRDs in dir and waits until each is Established. (framework's
// ApplyManifests runs `kubectl wait --all`, which fails on a CRD whose status is not written yet.)
func InstallCRDs(cfg *rest.Config, dir string) error {
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return err
	}
	if err := apiextensionsv1.AddToScheme(c.Scheme()); err != nil {
		return err
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return err
	}
	// Three minutes: each LeaderWorkerSet CRD is megabytes of schema, and on a loaded machine
	// (two control planes in one test, other suites beside) one took over a minute.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(b, &crd); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if crd.Kind != "CustomResourceDefinition" {
			continue // the directory's kustomization.yaml
		}
		if err := c.Create(ctx, &crd); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		for !established(&crd) {
			select {
			case <-ctx.Done():
				return fmt.Errorf("CRD %s not Established", crd.Name)
			case <-time.After(100 * time.Millisecond):
			}
			if err := c.Get(ctx, client.ObjectKeyFromObject(&crd), &crd); err != nil {
				return err
			}
		}
	}
	return nil
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}

// SnapshotterClient is the module of external-snapshotter's API types; its config/crd holds the
// VolumeSnapshot CRDs of the same version.
const SnapshotterClient = "github.com/kubernetes-csi/external-snapshotter/client/v8"

// SnapshotCRDs returns the directory of the VolumeSnapshot CRDs of the external-snapshotter client
// the repository's go.mod requires, from the module cache.
func SnapshotCRDs(repoRoot string) (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", SnapshotterClient)
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s: %w", SnapshotterClient, err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "config", "crd"), nil
}
