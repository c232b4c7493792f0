package main

import (
	"os/exec"
	"strings"
	"testing"
)

// dataPlane are the packages only the node plugin (cmd/csi-driver) may link: the S3 SDK, the
// NFS client, mount-utils and Cistern's own volume engine and staging engine. The controller and
// the sidecar share only the small contract (pkg/consts, pkg/ids, pkg/params, the API types).
var dataPlane = []string{
	"github.com/aws/aws-sdk-go",
	"github.com/aws/smithy-go",
	"github.com/willscott/go-nfs",
	"k8s.io/mount-utils",
	"github.com/cistern-csi/cistern/pkg/driver",
	"github.com/cistern-csi/cistern/pkg/volume",
	"github.com/cistern-csi/cistern/pkg/image",
}

// dataPlaneExact are packages forbidden themselves while some subpackage of theirs is allowed
// (pkg/params uses datasource/source's key table). TODO(issue 23): revisit once pkg/datasource
// is split.
var dataPlaneExact = []string{
	"github.com/cistern-csi/cistern/pkg/datasource",
	"github.com/cistern-csi/cistern/pkg/datasource/peer",
	"github.com/cistern-csi/cistern/pkg/datasource/s3source",
	"github.com/cistern-csi/cistern/pkg/datasource/nfssource",
}

// TestBinariesDoNotLinkTheDataPlane keeps each binary on its own dependency tree: the
// workload-controller and the storagepool-sidecar run with cluster-wide credentials and must not
// carry the node's data plane (its size, its CVEs, its init-time side effects).
func TestBinariesDoNotLinkTheDataPlane(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command lists the dependencies: %v", err)
	}
	for _, bin := range []string{".", "../storagepool-sidecar"} {
		out, err := exec.Command(goTool, "list", "-deps", bin).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", bin, err)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 100 {
			t.Fatalf("go list -deps %s listed only %d packages", bin, len(deps))
		}
		for _, p := range deps {
			for _, bad := range dataPlane {
				if p == bad || strings.HasPrefix(p, bad+"/") || strings.HasPrefix(p, bad+"-") {
					t.Errorf("%s links %s", bin, p)
				}
			}
			for _, bad := range dataPlaneExact {
				if p == bad {
					t.Errorf("%s links %s", bin, p)
				}
			}
		}
		t.Logf("%s: %d packages", bin, len(deps))
	}
}
