// Package sanity runs the upstream csi-test sanity suite against the real Cistern driver on a
// unix socket, with a pool on a real loop-mounted filesystem and real volume mounts.
package sanity

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
	d, err := driver.New(driver.Config{
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
	})
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
	cfg.TestVolumeParameters = map[string]string{"pool": "fast"}
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
