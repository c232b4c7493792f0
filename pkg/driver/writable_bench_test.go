//go:build bench

// A benchmark written as a test (it needs a *testing.T's helpers and subtests): built only
// with -tags bench, by make bench-writable.

package driver

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cistern-csi/cistern/pkg/volume"
	"github.com/cistern-csi/cistern/test/testutil"
)

// TestWritableReadyBench (make bench-writable): how
// long a new writable volume of a cached dataset takes to be ready, layered on the cache
// against the copy it replaced (--writable-datasets=copy, measured in the same run, on the same
// pool and dataset, samples interleaved). Ready is NodeStageVolume plus NodePublishVolume of a
// volume CreateVolume just made, through the driver's socket: attach, mkfs, mount, the caller's
// access proof, then the overlay or the copy, then the bind mount. An empty volume of the same
// size (no dataset) is measured next to both: the floor of any new volume, mkfs mostly.
//
// Datasets are one large file each, on file:// sources generated here: 2 GiB of patterned data,
// and 20 GiB of zeros in a sparse file. The 2 GiB case runs on a pool image under
// CISTERN_BENCH_DIR (default /var/tmp); the 20 GiB one on a zram device of 64 GiB (zero pages cost
// it no memory): this machine's shared disk has no room for a 20 GiB cache plus a 20 GiB copy. Its
// copy baseline writes to memory, not to a disk, so its ratio is the conservative one. Pools are
// ext4 and xfs, mounted with discard, so that a deleted volume gives its blocks back.
func TestWritableReadyBench(t *testing.T) {
	testutil.RequireRoot(t)
	dir := os.Getenv("CISTERN_BENCH_DIR")
	if dir == "" {
		dir = "/var/tmp"
	}
	samples := 3
	if n, err := strconv.Atoi(os.Getenv("CISTERN_BENCH_SAMPLES")); err == nil && n > 0 {
		samples = n
	}
	sizes := map[string]int64{"model-2g": 2 << 30, "model-20g": 20 << 30}
	names := []string{"model-2g", "model-20g"}
	if only := os.Getenv("CISTERN_BENCH_DATASETS"); only != "" {
		names = strings.Split(only, ",")
	}
	root, err := os.MkdirTemp(dir, "cistern-bench-writable-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	src := filepath.Join(root, "sources")
	for _, name := range names {
		writeModel(t, filepath.Join(src, name, "model.bin"), sizes[name])
	}
	var lines []string
	for _, fs := range []string{"ext4", "xfs"} {
		for _, name := range names {
			var pool string
			if sizes[name] > 2<<30 {
				pool = zramPool(t, root, fs, 64<<30)
			} else {
				pool = benchPool(t, root, fs, 16<<30)
			}
			env := startDriver(t, testPool{name: "bench", path: pool})
			env.stop()
			env.cfg.Datasets.LocalSourceRoots = []string{src}
			env.start()
			lines = append(lines, benchWritable(t, env, pool, src, name, fs, sizes[name], samples))
			env.stop()
		}
	}
	fmt.Println()
	for _, l := range lines {
		fmt.Println(l)
	}
}

// writeModel makes the source file: patterned data up to 2 GiB, a sparse file of zeros above.
func writeModel(t *testing.T, path string, size int64) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if size > 2<<30 {
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		return
	}
	chunk := make([]byte, 4<<20)
	for off := int64(0); off < size; off += int64(len(chunk)) {
		for i := range chunk {
			chunk[i] = byte(int64(i)*131 + off>>20)
		}
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
}

// zramPool makes a pool of fs on a new zram device of size bytes, mounted with discard; the
// device goes with the test.
func zramPool(t *testing.T, root, fs string, size int64) string {
	t.Helper()
	id, err := os.ReadFile("/sys/class/zram-control/hot_add")
	if err != nil {
		t.Fatalf("a zram device (the 20 GiB case needs one): %v", err)
	}
	n := strings.TrimSpace(string(id))
	dev, mnt := "/dev/zram"+n, filepath.Join(root, "zram-"+fs)
	t.Cleanup(func() {
		testutil.UnmountUnder(mnt)
		testutil.DetachLoopsUnder(mnt)
		_ = exec.Command("umount", mnt).Run()
		_ = os.WriteFile("/sys/class/zram-control/hot_remove", []byte(n), 0)
	})
	if err := os.WriteFile("/sys/block/zram"+n+"/disksize", []byte(strconv.FormatInt(size, 10)), 0); err != nil {
		t.Fatal(err)
	}
	mkfs := []string{"mkfs." + fs, "-q", "-f", dev}
	if fs == "ext4" {
		mkfs = []string{"mkfs.ext4", "-q", "-F", "-m0", dev}
	}
	testutil.Run(t, mkfs...)
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, "mount", "-o", "discard", dev, mnt)
	return mnt
}

// benchPool makes a pool of fs on a sparse image under root, mounted with discard.
func benchPool(t *testing.T, root, fs string, size int64) string {
	t.Helper()
	img, mnt := filepath.Join(root, "pool-"+fs+".img"), filepath.Join(root, "pool-"+fs)
	t.Cleanup(func() { _ = os.Remove(img) })
	testutil.FSImage(t, img, fs, size)
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, "mount", "-o", "loop,discard", img, mnt)
	t.Cleanup(func() {
		testutil.UnmountUnder(mnt)
		testutil.DetachLoopsUnder(mnt)
		_ = exec.Command("umount", mnt).Run()
	})
	return mnt
}

// benchWritable stages dataset name on the pool once, then times samples of a new writable
// volume, layered and copied in turn, and returns the summary line.
func benchWritable(t *testing.T, env *testEnv, pool, src, name, fs string, size int64, samples int) string {
	t.Helper()
	capacity := size + size/10 + 256<<20
	params := map[string]string{"source": "file://" + filepath.Join(src, name), "pool": "bench"}
	start := time.Now()
	warm := benchVolume(t, env, name+"-warm", capacity, params)
	readyVolume(t, env, warm, 30*time.Minute, true)
	t.Logf("%s on %s: staged in %s", name, fs, time.Since(start).Round(time.Millisecond))
	dropVolume(t, env, warm, pool)
	// Interleaved per sample: layered, copied, and an empty volume of the same size (no dataset:
	// attach, mkfs, mount and bind alone, the floor of any new volume).
	kinds := []string{"layered", "copied", "empty"}
	took := map[string][]time.Duration{}
	for i := range samples {
		for k := range kinds {
			kind := kinds[(i+k)%len(kinds)] // each kind after each other one, in turn
			env.stop()
			env.cfg.Writable = volume.WritableDatasets{Copy: kind == "copied"}
			env.start()
			p := params
			if kind == "empty" {
				p = map[string]string{"pool": "bench"}
			}
			v := benchVolume(t, env, fmt.Sprintf("%s-%d-%s", name, i, kind), capacity, p)
			took[kind] = append(took[kind], readyVolume(t, env, v, 30*time.Minute, kind != "empty"))
			dropVolume(t, env, v, pool)
		}
	}
	ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
	sum := func(d []time.Duration) (lo, med, hi float64) {
		s := slices.Clone(d)
		slices.Sort(s)
		return ms(s[0]), ms(s[len(s)/2]), ms(s[len(s)-1])
	}
	lLo, lMed, lHi := sum(took["layered"])
	cLo, cMed, cHi := sum(took["copied"])
	eLo, eMed, eHi := sum(took["empty"])
	return fmt.Sprintf("writable: dataset=%s pool_fs=%s ready_ms=%.1f (min %.1f max %.1f) copy_ms=%.1f (min %.1f max %.1f) copy_over_ready=%.0f empty_volume_ms=%.1f (min %.1f max %.1f) samples=%d",
		name, fs, lMed, lLo, lHi, cMed, cLo, cHi, cMed/lMed, eMed, eLo, eHi, samples)
}

func benchVolume(t *testing.T, env *testEnv, name string, capacity int64, params map[string]string) *csi.Volume {
	t.Helper()
	resp, err := env.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: name,
		CapacityRange: &csi.CapacityRange{RequiredBytes: capacity}, VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}, Parameters: params})
	if err != nil {
		t.Fatalf("CreateVolume %s: %v", name, err)
	}
	return resp.Volume
}

// readyVolume stages and publishes vol, as kubelet does (retrying while the dataset stages), and
// returns how long that took.
func readyVolume(t *testing.T, env *testEnv, vol *csi.Volume, limit time.Duration, dataset bool) time.Duration {
	t.Helper()
	ctx := context.Background()
	staging, target := filepath.Join(env.dir, "staging", vol.VolumeId), filepath.Join(env.dir, "target", vol.VolumeId)
	start := time.Now()
	for {
		_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging,
			VolumeCapability: mountCap(""), VolumeContext: vol.VolumeContext})
		if err == nil {
			break
		}
		if status.Code(err) != codes.Unavailable || time.Since(start) > limit {
			t.Fatalf("NodeStageVolume %s: %v", vol.VolumeId, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: mountCap(""), VolumeContext: vol.VolumeContext}); err != nil {
		t.Fatalf("NodePublishVolume %s: %v", vol.VolumeId, err)
	}
	d := time.Since(start)
	if !dataset {
		return d
	}
	if fi, err := os.Stat(filepath.Join(target, "model.bin")); err != nil {
		t.Fatalf("the volume does not show the dataset: %v", err)
	} else if fi.Size() == 0 {
		t.Fatal("the volume's model.bin is empty")
	}
	return d
}

// dropVolume unpublishes, unstages and deletes vol, and trims the pool so that its blocks go
// back to the disk.
func dropVolume(t *testing.T, env *testEnv, vol *csi.Volume, pool string) {
	t.Helper()
	env.unpublishAndUnstage(vol.VolumeId)
	if _, err := env.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: vol.VolumeId}); err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, "fstrim", pool)
	// The next sample starts on a quiet disk, not behind this volume's writeback.
	unix.Sync()
}
