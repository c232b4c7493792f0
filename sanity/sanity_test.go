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
	"sync"
	"testing"
	"time"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"

	"github.com/cistern-csi/cistern/pkg/datasource/cache"
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
		runChild(t, "TestSanityDatasetVolumes")
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

// TestSanityStreamingVolumes runs the suite with every test volume a writable dataset volume
// with dataMode streaming: each staging layers the volume on the dataset's streaming tree (a
// FUSE mount under an overlay), as the dataset (a node-local source with a 24 MiB file, staged
// at 64 KiB/s) stays unstaged for the whole run. It passes its own count of specs
// (test/specgate, "sanity/streaming") and checks that its volumes did stream.
func TestSanityStreamingVolumes(t *testing.T) {
	if f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0); err != nil {
		testutil.Unavailable(t, "streaming volumes need /dev/fuse: %v", err) // fails under CI
	} else {
		f.Close()
	}
	if os.Getenv("CISTERN_SANITY_CHILD") == "" {
		runChild(t, "TestSanityStreamingVolumes")
		return
	}
	src := t.TempDir()
	files := map[string][]byte{"set/a.txt": []byte("alpha"), "set/weights.bin": make([]byte, 24<<20)}
	for name, data := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex // the driver's goroutines report fallbacks
	var fallbacks, trees []string
	var streamed map[string]bool
	runSanityWith(t, func(cfg *driver.Config, params map[string]string) {
		cfg.Datasets.LocalSourceRoots = []string{src}
		cfg.Datasets.BandwidthBytesPerSec = 64 << 10
		cfg.Streaming.OnFallback = func(id, _, reason string) {
			mu.Lock()
			defer mu.Unlock()
			fallbacks = append(fallbacks, id+": "+reason)
		}
		params["source"] = "file://" + filepath.Join(src, "set")
		params["dataMode"] = "streaming"
	}, "sanity/streaming", func(dir, poolDir string) func() {
		stop := make(chan struct{})
		done := make(chan map[string]bool)
		go func() { done <- watchStreamMounts(dir, stop) }()
		return func() {
			close(stop)
			streamed = <-done
			trees, _ = filepath.Glob(filepath.Join(cache.Dir(poolDir), "*", cache.TreeDir))
		}
	})
	// A dataset volume's staging waits for its dataset (Unavailable: a failed spec) unless it
	// streams or falls back (reported): with the dataset unstaged until the end and no fallback,
	// every staging streamed. The mounts seen are a sample.
	mu.Lock()
	if len(fallbacks) > 0 {
		t.Errorf("volumes staged instead of streamed: %q", fallbacks)
	}
	mu.Unlock()
	if len(trees) > 0 {
		t.Errorf("the dataset was staged during the run (%v): the volumes after it were layered on the cache", trees)
	}
	if len(streamed) == 0 {
		t.Error("no volume was seen layered on a streaming tree")
	}
	t.Logf("%d streaming trees seen mounted (looking every 50 ms)", len(streamed))
}

// watchStreamMounts notes, until stop, the streaming trees mounted under dir (the FUSE mounts
// under the volumes' overlays), looking every 50 ms.
func watchStreamMounts(dir string, stop <-chan struct{}) map[string]bool {
	seen := map[string]bool{}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		data, _ := os.ReadFile("/proc/self/mountinfo")
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") && strings.Contains(line, " - fuse.cistern-stream ") {
				seen[f[4]] = true
			}
		}
		select {
		case <-stop:
			return seen
		case <-t.C:
		}
	}
}

// runChild runs test name in a child process (ginkgo runs one suite per process: TestSanity's
// is this one's) and logs its counts.
func runChild(t *testing.T, name string) {
	cmd := exec.Command(os.Args[0], "-test.run", "^"+name+"$", "-test.v")
	cmd.Env = append(os.Environ(), "CISTERN_SANITY_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+name) {
		t.Fatalf("%s: %v\n%s", name, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "Passed") || strings.Contains(line, "streaming trees") {
			t.Log(strings.TrimSpace(line))
		}
	}
}

// runSanity runs csi-sanity against a driver; dataset, when set, adjusts its config and the
// test volumes' parameters.
func runSanity(t *testing.T, dataset func(*driver.Config, map[string]string)) {
	runSanityWith(t, dataset, "sanity", nil)
}

// runSanityWith is runSanity gated at suite's count of specs (test/specgate); watch, when
// set, is called with the driver's directory and pool before the suite, and what it returns
// after.
func runSanityWith(t *testing.T, dataset func(*driver.Config, map[string]string), suite string, watch func(dir, poolDir string) func()) {
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
	if watch != nil {
		end := watch(dir, poolDir)
		sanity.Test(t, cfg)
		end()
	} else {
		sanity.Test(t, cfg)
	}
	data, err := json.Marshal([]types.Report{report})
	if err != nil {
		t.Fatal(err)
	}
	specs, err := specgate.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	specgate.Check(t, suite, specs)
}
