package testutil

import (
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/workloads"
	"github.com/cistern-csi/cistern/test/framework"
)

// InstallDropIn renders deploy/csi with the lws-upstream component and installs on cp what the
// drop-in needs to run in this process (RenderWithRBAC) and the rendered CRDs.
func InstallDropIn(t framework.TB, cp *framework.ControlPlane) (Rendered, error) {
	t.Helper()
	rendered, err := RenderWithRBAC(t, cp, "lws-upstream")
	if err != nil {
		return nil, err
	}
	return rendered, rendered.InstallCRDs(t, cp.Config)
}

// InstallCRDs installs the rendered CustomResourceDefinitions (see InstallCRDs).
func (r Rendered) InstallCRDs(t framework.TB, cfg *rest.Config) error {
	dir := t.TempDir()
	for i, crd := range r["CustomResourceDefinition"] {
		b, err := yaml.Marshal(crd)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("crd-%d.yaml", i)), b, 0o644); err != nil {
			return err
		}
	}
	return InstallCRDs(cfg, dir)
}

// StartDropIn runs the controller in this process as the cluster's LeaderWorkerSet controller
// (--leaderworkerset-api=leaderworkerset.x-k8s.io/v1), as its ServiceAccount (StartController).
func StartDropIn(t framework.TB, cp *framework.ControlPlane) error {
	t.Helper()
	wc, err := ControllerConfig(func(wc *workloads.Config) { wc.LeaderWorkerSetAPI = v1alpha1.UpstreamGroupVersion })
	if err != nil {
		return err
	}
	return StartController(framework.ServiceAccountConfig(t, cp, ControllerNamespace, ControllerSA), wc)
}
