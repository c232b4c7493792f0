package cluster

import (
	"fmt"
	"path/filepath"

	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testutil"
)

// Namespace is where deploy/csi installs everything.
const Namespace = "cistern-system"

// ServiceAccounts deploy/csi creates, one per component.
const (
	NodeServiceAccount       = "cistern-node"
	ControllerServiceAccount = "cistern-workload-controller"
)

// DeployDir is deploy/csi.
func DeployDir() string { return filepath.Join(framework.RepoRoot(), "deploy", "csi") }

// Binaries are Cistern's commands built by BuildBinaries.
type Binaries struct {
	Driver, Sidecar, Controller string
	// Provisioner is the upstream external-provisioner (make csi-tools).
	Provisioner string
}

// BinDir is where BuildBinaries puts the commands: a directory that outlives a run, so that an
// unchanged tree is not linked again (the go command leaves an up-to-date output alone).
func BinDir() string { return filepath.Join(framework.RepoRoot(), "_output", "bin") }

// BuildBinaries builds Cistern's commands into dir with the go command, and finds the
// external-provisioner from $CISTERN_CSI_BIN or the cache.
func BuildBinaries(dir string) (Binaries, error) {
	cmd := testutil.GoBuild(dir+"/", "./cmd/...")
	cmd.Dir = framework.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("go build ./cmd/...: %v\n%s", err, out)
	}
	prov, err := framework.ExternalProvisionerPath()
	if err != nil {
		return Binaries{}, err
	}
	return Binaries{
		Driver:      filepath.Join(dir, "csi-driver"),
		Sidecar:     filepath.Join(dir, "storagepool-sidecar"),
		Controller:  filepath.Join(dir, "workload-controller"),
		Provisioner: prov,
	}, nil
}
