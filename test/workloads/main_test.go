// Package workloads_test runs the workload-controller against a real control plane:
// kube-apiserver with etcd, kube-controller-manager (whose StatefulSet controller creates the pods
// and claims, whose garbage collector and PV binder do their real work) and kube-scheduler. The
// controller runs in the test process with its webhooks self-registered on a loopback address.
// No kubelet runs: fakeKubelet plays its part for pods bound to the test's nodes.
package workloads_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cistern-csi/cistern/pkg/workloads"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/workloads/testutil"
)

func TestMain(m *testing.M) {
	os.Exit(framework.RunShared(m, testutil.ControlPlane))
}

// cl is an admin client with the controller's scheme.
var cl client.Client

// setup installs the CRDs and starts one controller for the whole package.
func setup(t *testing.T) *framework.ControlPlane {
	t.Helper()
	return framework.SharedSetup(t, func(cp *framework.ControlPlane) error {
		c, err := client.New(cp.Config, client.Options{Scheme: workloads.Scheme()})
		if err != nil {
			return err
		}
		if err := testutil.InstallCRDs(cp.Config, filepath.Join(framework.RepoRoot(), "deploy", "csi", "crds")); err != nil {
			return err
		}
		cl = c
		// The controller runs as its ServiceAccount with the RBAC of deploy/, so the manifests
		// are tested along with the code.
		rendered, err := testutil.RenderWithRBAC(t, cp)
		if err != nil {
			return err
		}
		// And under its admission policy: every PersistentVolume, pod, StatefulSet and Service
		// the suite's controller makes passes it.
		policy, err := rendered.Named("cistern-workload-controller-writes").YAML("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
		if err != nil {
			return err
		}
		framework.ApplyYAML(t, cp, policy)
		return startController(framework.ServiceAccountConfig(t, cp, testutil.ControllerNamespace, testutil.ControllerSA))
	})
}

// setupNamespace is how a test of the suite begins: the shared control plane with the controller
// (setup), a namespace of the test's own whose name begins with prefix, and a context for its API
// calls that ends with the test.
func setupNamespace(t *testing.T, prefix string) (*framework.ControlPlane, string, context.Context) {
	t.Helper()
	cp := setup(t)
	return cp, framework.CreateNamespace(t, cp, prefix), testutil.Context(t)
}

// startController runs the controller in this process until the test binary exits.
func startController(cfg *rest.Config) error {
	wc, err := testutil.ControllerConfig(func(wc *workloads.Config) {
		wc.VolumeManager.LocalSourceRoots = []string{"/srv/datasets"}
		wc.NodeLoss.Enabled = true
	})
	if err != nil {
		return err
	}
	return testutil.StartController(cfg, wc)
}
