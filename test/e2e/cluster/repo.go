package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/cistern-csi/cistern/test/framework"
)

// Namespace is where deploy/csi installs everything.
const Namespace = "cistern-system"

// ServiceAccounts deploy/csi creates, one per component.
const (
	NodeServiceAccount       = "cistern-node"
	ControllerServiceAccount = "cistern-workload-controller"
)

// RepoRoot is the repository this package was built from.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// DeployDir is deploy/csi.
func DeployDir() string { return filepath.Join(RepoRoot(), "deploy", "csi") }

// Features says which of Cistern's components this tree has: each is in use once its
// manifests are in deploy/csi and its command does real work.
type Features struct {
	StoragePools bool // storagepool-sidecar + StoragePool CRD + its RBAC
	Workloads    bool // workload-controller + its CRDs + RBAC
	Datasets     bool // the driver stages datasets (pkg/datasource wired into pkg/driver)
}

// DetectFeatures looks at the tree.
func DetectFeatures() Features {
	root := RepoRoot()
	exists := func(p ...string) bool {
		_, err := os.Stat(filepath.Join(append([]string{root}, p...)...))
		return err == nil
	}
	stub := func(cmd string) bool {
		data, err := os.ReadFile(filepath.Join(root, "cmd", cmd, "main.go"))
		return err != nil || strings.Contains(string(data), "not implemented yet")
	}
	return Features{
		StoragePools: !stub("storagepool-sidecar") && exists("deploy", "csi", "storagepool-sidecar"),
		Workloads:    !stub("workload-controller") && exists("deploy", "csi", "workload-controller"),
		Datasets:     driverImports("github.com/cistern-csi/cistern/pkg/datasource"),
	}
}

func driverImports(pkg string) bool {
	entries, _ := filepath.Glob(filepath.Join(RepoRoot(), "pkg", "driver", "*.go"))
	for _, f := range entries {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		data, err := os.ReadFile(f)
		if err == nil && strings.Contains(string(data), `"`+pkg) {
			return true
		}
	}
	return false
}

// Binaries are Cistern's commands built by BuildBinaries.
type Binaries struct {
	Driver, Sidecar, Controller string
	// Provisioner is the upstream external-provisioner (make csi-tools).
	Provisioner string
}

// BinDir is where BuildBinaries puts the commands: a directory that outlives a run, so that an
// unchanged tree is not linked again (the go command leaves an up-to-date output alone).
func BinDir() string { return filepath.Join(RepoRoot(), "_output", "bin") }

// BuildBinaries builds Cistern's commands into dir with the go command, and finds the
// external-provisioner from $CISTERN_CSI_BIN or the cache.
func BuildBinaries(dir string) (Binaries, error) {
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/...")
	cmd.Dir = RepoRoot()
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
