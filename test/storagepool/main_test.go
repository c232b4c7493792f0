// Package storagepool_test runs the real csi-driver and storagepool-sidecar binaries against a
// real kube-apiserver: the sidecar authenticates as the ServiceAccount of deploy/csi, bound to
// its ClusterRole, never as admin.
package storagepool_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testutil"
)

// binDir holds csi-driver and storagepool-sidecar, built once for the package.
var binDir string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "cistern-storagepool-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	cmd := testutil.GoBuild(dir+"/", "./cmd/csi-driver", "./cmd/storagepool-sidecar")
	cmd.Dir = framework.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the binaries: %v\n%s", err, out)
		return 1
	}
	binDir = dir
	return framework.RunShared(m, framework.Options{})
}
