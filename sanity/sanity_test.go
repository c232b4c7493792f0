// Package sanity runs the upstream csi-test sanity suite against the real Cistern driver on a
// unix socket, with a pool on a real loop-mounted filesystem and real volume mounts.
package sanity

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"

	"github.com/cistern-csi/cistern/pkg/driver"
	"github.com/cistern-csi/cistern/test/specgate"
	"github.com/cistern-csi/cistern/test/testutil"
)

func TestSanity(t *testing.T) {
	runSanity(t, nil)
}

// TestSanityDatasetVolumes runs the suite with every test volume a dataset volume (a class
// whose parameters name a source): its restores and clones take their data from the snapshot
// or source volume, never from the dataset (docs/security.md).
func TestSanityDatasetVolumes(t *testing.T) {
	// Ginkgo runs one suite per process: TestSanity's is this one's, so this one runs in a
	// child process of its own.
	if os.Getenv("CISTERN_SANITY_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestSanityDatasetVolumes$", "-test.v")
		cmd.Env = append(os.Environ(), "CISTERN_SANITY_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestSanityDatasetVolumes") {
			t.Fatalf("csi-sanity with dataset volumes: %v\n%s", err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, "Passed") {
				t.Log(strings.TrimSpace(line))
			}
		}
		return
	}
	src := t.TempDir()
	for name, data := range map[string]string{"set/a.txt": "alpha", "set/d/b.txt": "beta"} {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	runSanity(t, func(cfg *driver.Config, params map[string]string) {
		cfg.Datasets.LocalSourceRoots = []string{src}
		params["source"] = "file://" + filepath.Join(src, "set")
	})
}

// runSanity runs csi-sanity against a driver; dataset, when set, adjusts its config and the
// test volumes' parameters.
func runSanity(t *testing.T, dataset func(*driver.Config, map[string]string)) {
	testutil.RequireRoot(t)
	poolDir := testutil.LoopFS(t, "ext4", 4<<30)
	dir := t.TempDir()
	t.Cleanup(func() {
		testutil.UnmountUnder(dir)
		testutil.DetachLoopsUnder(poolDir)
	})
	poolsConfig := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(poolsConfig, []byte(fmt.Sprintf("pools:\n- name: fast\n  path: %s\n  labels: {media: ssd}\n", poolDir)), 0o644); err != nil {
		t.Fatal(err)
	}
	endpoint := "unix://" + filepath.Join(dir, "csi.sock")
	dcfg := driver.Config{
		DriverName:        "cistern.csi.dev",
		VendorVersion:     "sanity",
		Endpoint:          endpoint,
		NodeID:            "sanity-node",
		Mode:              driver.ModeAll,
		PoolsConfig:       poolsConfig,
		StateDir:          filepath.Join(dir, "state"),
		DefaultVolumeSize: 64 << 20,
		PoolCheckInterval: time.Second,
		KubeletRoot:       dir, // where TargetPath and StagingPath are below
	}
	params := map[string]string{"pool": "fast"}
	if dataset != nil {
		dataset(&dcfg, params)
	}
	d, err := driver.New(dcfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	<-d.Ready()

	cfg := sanity.NewTestConfig()
	cfg.Address = endpoint
	cfg.TargetPath = filepath.Join(dir, "target")
	cfg.StagingPath = filepath.Join(dir, "staging")
	cfg.TestVolumeSize = 64 << 20
	cfg.TestVolumeExpandSize = 128 << 20
	cfg.IdempotentCount = 3
	cfg.TestVolumeParameters = params
	cfg.TestVolumeMutableParameters = map[string]string{"readAheadKiB": "1024"}
	// The suite must pass as many specs as test/specgate/expected.txt says; the specs that
	// skip themselves are listed as skipped subtests.
	var report types.Report
	ginkgo.ReportAfterSuite("spec count", func(r types.Report) { report = r })
	sanity.Test(t, cfg)
	data, err := json.Marshal([]types.Report{report})
	if err != nil {
		t.Fatal(err)
	}
	specs, err := specgate.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	specgate.Check(t, "sanity", specs)
}
