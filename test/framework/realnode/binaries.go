package realnode

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testutil"
)

// Where the suite finds what the Makefile built; keep the defaults in step with
// hack/make/70-e2enode.mk.
const (
	// NodeBinEnv is the directory with containerd, containerd-shim-runc-v2, ctr, runc and cni/.
	NodeBinEnv = "CISTERN_NODE_BIN"
	// ImagesEnv is the images.json written by hack/images/build.
	ImagesEnv = "CISTERN_NODE_IMAGES"

	containerdVersion           = "v2.4.2"
	defaultImagesRelativeToRepo = "_output/node-images/images.json"
)

// Binaries are the paths of everything the suite runs.
type Binaries struct {
	Kubelet, containerd, ctr, runc, cniDir, shimDir string
	provisioner, driver, registrar                  string
	Images                                          map[string]ImageEntry
}

// ImageEntry is one image of images.json: its reference and the tarball `ctr images import` reads.
type ImageEntry struct {
	Ref     string `json:"ref"`
	Tarball string `json:"tarball"`
}

// FindBinaries locates the built tools and builds the driver; a missing tool skips the suite
// (fails it under CI=true) with the make target that builds it.
func FindBinaries(t *testing.T) *Binaries {
	t.Helper()
	nodeBin, err := framework.ToolDir(NodeBinEnv, "node-runtime-"+containerdVersion)
	if err != nil {
		t.Fatal(err)
	}
	b := &Binaries{
		Kubelet:     framework.Binary(t, "kubelet"),
		containerd:  filepath.Join(nodeBin, "containerd"),
		ctr:         filepath.Join(nodeBin, "ctr"),
		runc:        filepath.Join(nodeBin, "runc"),
		shimDir:     nodeBin,
		cniDir:      filepath.Join(nodeBin, "cni"),
		provisioner: framework.ExternalProvisioner(t),
	}
	for path, target := range map[string]string{
		b.containerd: "make node-tools",
		filepath.Join(nodeBin, "containerd-shim-runc-v2"): "make node-tools",
		b.ctr:                                 "make node-tools",
		b.runc:                                "make node-tools",
		filepath.Join(b.cniDir, "loopback"):   "make node-tools",
		filepath.Join(b.cniDir, "ptp"):        "make node-tools",
		filepath.Join(b.cniDir, "host-local"): "make node-tools",
		b.provisioner:                         "make csi-tools",
	} {
		if _, err := os.Stat(path); err != nil {
			Unavailable(t, "%s not found; run `%s`", path, target)
		}
	}

	imagesFile := os.Getenv(ImagesEnv)
	if imagesFile == "" {
		root, err := RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		imagesFile = filepath.Join(root, defaultImagesRelativeToRepo)
	}
	data, err := os.ReadFile(imagesFile)
	if err != nil {
		Unavailable(t, "test images: %v; run `make node-images`", err)
	}
	if err := json.Unmarshal(data, &b.Images); err != nil {
		t.Fatalf("reading %s: %v", imagesFile, err)
	}
	for _, name := range []string{"pause", "checker", "git", "papermill"} {
		if _, ok := b.Images[name]; !ok {
			Unavailable(t, "%s has no %q image; run `make node-images`", imagesFile, name)
		}
	}

	b.driver = filepath.Join(t.TempDir(), "csi-driver")
	out, err := testutil.GoBuild(b.driver, "github.com/cistern-csi/cistern/cmd/csi-driver").CombinedOutput()
	if err != nil {
		t.Fatalf("building the driver: %v\n%s", err, out)
	}
	// node-driver-registrar is not served here: its stand-in registers the driver, as the
	// registrar container of deploy/csi does.
	b.registrar = filepath.Join(t.TempDir(), "node-driver-registrar")
	if out, err := testutil.GoBuild(b.registrar, "github.com/cistern-csi/cistern/hack/standins/node-driver-registrar").CombinedOutput(); err != nil {
		t.Fatalf("building the node-driver-registrar stand-in: %v\n%s", err, out)
	}
	return b
}

// RepoRoot is framework.RepoRoot, with the error the suite's call sites check.
func RepoRoot() (string, error) { return framework.RepoRoot(), nil }

// Unavailable skips the suite for want of a tool or a machine capability, or fails it under
// CI=true, so that CI cannot pass by skipping what the Makefile should have provided.
func Unavailable(t *testing.T, format string, args ...any) {
	t.Helper()
	testutil.Unavailable(t, "node e2e: "+format, args...)
}

// LogDuration logs how long what took since start.
func LogDuration(t *testing.T, what string, start time.Time) {
	t.Logf("%s took %s", what, time.Since(start).Round(time.Millisecond))
}

// RequireImages makes the test unavailable (Unavailable) when one of the named images was not built.
func (b *Binaries) RequireImages(t *testing.T, names ...string) {
	t.Helper()
	for _, name := range names {
		if _, ok := b.Images[name]; !ok {
			Unavailable(t, "no %q image; run `make node-images`", name)
		}
	}
}
