// Package e2e_test runs Cistern end to end on a real control plane: etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler; per simulated node the CSI driver, the upstream
// external-provisioner v6.4.0 in node-deployment mode with capacity tracking, and the
// storagepool-sidecar; the workload-controller; all installed and authorized by deploy/csi.
// No kubelet runs: the suite creates Node and CSINode objects as kubelet and
// node-driver-registrar would, reports pods Running as a kubelet would, and calls
// NodeStageVolume/NodePublishVolume over the driver's socket as kubelet does.
package e2e_test

import (
	"os"
	"testing"

	"github.com/cistern-csi/cistern/test/e2e/cluster"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testutil"
)

var (
	bins    cluster.Binaries
	binsErr error
)

func TestMain(m *testing.M) {
	bins, binsErr = cluster.BuildBinaries(cluster.BinDir())
	os.Exit(framework.RunShared(m, framework.Options{ControllerManager: true, Scheduler: true}))
}

// binaries returns the built commands, or fails (in CI) or skips the test.
func binaries(t testing.TB) cluster.Binaries {
	t.Helper()
	if binsErr != nil {
		testutil.Unavailable(t, "%v", binsErr)
	}
	return bins
}
