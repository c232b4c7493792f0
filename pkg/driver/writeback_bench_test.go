//go:build bench

// A benchmark written as a test (it needs a *testing.T's helpers and subtests): built only
// with -tags bench, by make bench-writeback.

package driver

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/test/testutil"
)

// TestBenchUnpublish (make bench-writeback): how long
// NodeUnpublishVolume of a writable inline volume that names an output target takes with 2 GiB
// written (one file) against the same volume with nothing written, through the driver's socket,
// 3 samples each (CISTERN_BENCH_SAMPLES for more), interleaved. The upload that follows runs after the RPC and is waited for
// between samples, untimed. The data is fsync'd by its writer (a pod that saved its outputs).
// Beside them, the same 2 GiB in a volume without an output target (deleted at unpublish), and
// left dirty in the page cache: what the sync the RPC does then costs. CISTERN_WRITEBACK_SCALE
// divides the size; CISTERN_BENCH_V=4 logs each RPC's steps (pkg/volume/steps.go).
func TestBenchUnpublish(t *testing.T) {
	testutil.RequireRoot(t)
	if v := os.Getenv("CISTERN_BENCH_V"); v != "" { // the release's steps are timed at V(4)
		fs := flag.NewFlagSet("klog", flag.ContinueOnError)
		klog.InitFlags(fs)
		_ = fs.Set("v", v)
	}
	scale := benchScale()
	size := (2 << 30) / scale
	// The S3 server's data on disk (CISTERN_BENCH_DIR, default /var/tmp), not the suite's
	// scratch tmpfs: there, with the pool's image (whose freed blocks stay in it), a sample's
	// parts and object outgrew its 8g, and the server answered 507 (InsufficientStorage) to
	// every CompleteMultipartUpload of the 2 GiB file. The pool and the driver's state stay on
	// the tmpfs, apart as a node's pool disk and root disk are.
	s3Dir, err := os.MkdirTemp(cmp.Or(os.Getenv("CISTERN_BENCH_DIR"), "/var/tmp"), "cistern-bench-s3-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(s3Dir) })
	env, s, _, _ := writeBackEnvS3(t, s3Dir, testPool{name: "fast", size: int64(size) + 3<<29})
	owner := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	ctx := context.Background()
	data := randomBytes(t, 64<<20)

	unpublish := func(id string, written int, output, sync bool) time.Duration {
		vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://shared/set", "endpoint": s.Endpoint,
			"pathStyle": "true", "size": fmt.Sprint(size + 512<<20),
			"csi.storage.k8s.io/pod.namespace": "bench", "csi.storage.k8s.io/pod.name": id, "csi.storage.k8s.io/pod.uid": id}
		if output {
			vc["outputTarget"] = "s3://out/bench/" + id
		}
		target := filepath.Join(env.dir, "target", id)
		if err := retryUnavailable(t, func() error {
			_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
				VolumeCapability: mountCap(""), VolumeContext: vc, Secrets: owner})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if written > 0 {
			f, err := os.Create(filepath.Join(target, "model.bin"))
			if err != nil {
				t.Fatal(err)
			}
			for n := 0; n < written; n += len(data) {
				if _, err := f.Write(data[:min(len(data), written-n)]); err != nil {
					t.Fatal(err)
				}
			}
			if sync {
				if err := f.Sync(); err != nil {
					t.Fatal(err)
				}
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		// Untimed: the upload, then the volume's deletion, before the next sample.
		deadline := time.Now().Add(10 * time.Minute)
		for {
			if _, ok := env.driver.volumes.Store().GetVolume(id); !ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("volume %s not uploaded in 10 minutes", id)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err := os.RemoveAll(filepath.Join(s.Dir, "out", "bench", id)); err != nil { // nothing for a plain one
			t.Fatal(err)
		}
		return took
	}
	// The third case, the same data in the same volume without an output target (deleted at
	// unpublish), is what unmounting and releasing 2 GiB costs without write-back.
	// The fourth, the data left dirty in the page cache, is what syncing it costs: the hand-off
	// syncs it to the volume's disk before NodeUnpublish returns, as any volume's unmount does.
	var empty, synced, plain, dirty []time.Duration
	for r := range benchSamples() {
		empty = append(empty, unpublish(fmt.Sprintf("empty-%d", r), 0, true, true))
		synced = append(synced, unpublish(fmt.Sprintf("synced-%d", r), size, true, true))
		plain = append(plain, unpublish(fmt.Sprintf("plain-%d", r), size, false, true))
		dirty = append(dirty, unpublish(fmt.Sprintf("dirty-%d", r), size, true, false))
	}
	fmt.Printf("writeback: unpublish %d MiB: nothing written %s, written and fsync'd %s (ratio %.2f); the same without an output target %s (ratio %.2f); written, not fsync'd %s (ratio %.2f); min/median/max, scale 1/%d\n",
		size>>20, spreadMs(empty), spreadMs(synced), medianRatio(synced, empty), spreadMs(plain), medianRatio(plain, empty),
		spreadMs(dirty), medianRatio(dirty, empty), scale)
	if f := os.Getenv("CISTERN_UNPUBLISH_RATIO_FILE"); f != "" {
		if err := os.WriteFile(f, fmt.Appendf(nil, "%.2f", medianRatio(synced, empty)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// benchSamples is CISTERN_BENCH_SAMPLES, at least 3: a few milliseconds of noise on either side
// decide a ratio of two RPCs this short, and more samples steady its median.
func benchSamples() int {
	var n int
	_, _ = fmt.Sscan(os.Getenv("CISTERN_BENCH_SAMPLES"), &n)
	return max(n, 3)
}

func benchScale() int {
	var n int
	_, _ = fmt.Sscan(os.Getenv("CISTERN_WRITEBACK_SCALE"), &n)
	return max(n, 1)
}

func medianOf(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func medianRatio(a, b []time.Duration) float64 { return medianOf(a).Seconds() / medianOf(b).Seconds() }

func spreadMs(d []time.Duration) string {
	s := slices.Clone(d)
	slices.Sort(s)
	return fmt.Sprintf("%d/%d/%d ms", s[0].Milliseconds(), s[len(s)/2].Milliseconds(), s[len(s)-1].Milliseconds())
}
