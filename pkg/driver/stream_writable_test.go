package driver

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"github.com/cistern-csi/cistern/pkg/fusekeeper"
	cparams "github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/volume"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// The tests of writable dataset volumes layered on a streaming tree (pkg/volume/streamlayer.go):
// versitygw as S3, real loop devices, a real FUSE tree under a real overlay, the FUSE keeper.

// streamedFiles are the dataset of these tests: 16 MiB of weights that a staging throttled to
// 1 MiB/s takes 16 s to fetch, and two small files.
var streamedFiles = map[string][]byte{
	"weights.bin":      bytes.Repeat([]byte("0123456789abcdef"), 1<<20),
	"cfg/config.json":  []byte(`{"layers": 32}`),
	"cfg/tokenizer.md": []byte(strings.Repeat("token ", 1000)),
}

// streamingEnv is a driver over an ext4 pool on a loop device, its staging throttled to 1 MiB/s,
// with a FUSE keeper, and a versitygw bucket "models" holding streamedFiles. It returns the
// dataset's parameters and the secrets that read it.
func streamingEnv(t *testing.T) (*testEnv, map[string]string, map[string]string, *fusekeeper.Keeper) {
	testutil.RequireFUSE(t)
	env := startDriver(t, testPool{name: "fast", fs: "ext4", size: 1 << 30})
	k, err := fusekeeper.Listen(filepath.Join(env.dir, "keeper.sock"))
	if err != nil {
		t.Fatal(err)
	}
	kctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Serve(kctx) }()
	t.Cleanup(func() { cancel(); <-done })
	env.stop()
	env.cfg.Datasets.BandwidthBytesPerSec = 1 << 20
	env.cfg.Streaming.Keeper = k.Path()
	env.start()
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "models")
	for k, v := range streamedFiles {
		s.Put(t, "models", k, v)
	}
	secrets := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	params := map[string]string{"source": "s3://models", "endpoint": s.Endpoint, "pathStyle": "true", "dataMode": "streaming", "pool": "fast"}
	return env, params, secrets, k
}

// stageStreamed stages and publishes a writable volume with the dataset's secrets (waiting out
// Unavailable) and returns its staging and target paths.
func (e *testEnv) stageStreamed(vol *csi.Volume, secrets map[string]string) (string, string) {
	e.t.Helper()
	ctx := context.Background()
	staging, target := filepath.Join(e.dir, "staging", vol.VolumeId), filepath.Join(e.dir, "target", vol.VolumeId)
	stage := func() error {
		_, err := e.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging,
			VolumeCapability: mountCap("ext4"), VolumeContext: vol.VolumeContext, Secrets: secrets})
		return err
	}
	if err := retryUnavailable(e.t, stage); err != nil {
		e.t.Fatalf("NodeStageVolume %s: %v", vol.VolumeId, err)
	}
	if err := stage(); err != nil { // idempotent
		e.t.Fatalf("repeated NodeStageVolume %s: %v", vol.VolumeId, err)
	}
	if _, err := e.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: mountCap("ext4"), VolumeContext: vol.VolumeContext}); err != nil {
		e.t.Fatalf("NodePublishVolume %s: %v", vol.VolumeId, err)
	}
	return staging, target
}

// mountType is the filesystem type of the mount at p, "" when none.
func mountType(t *testing.T, p string) string {
	t.Helper()
	data, _ := os.ReadFile("/proc/self/mountinfo")
	typ := ""
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || f[4] != p {
			continue
		}
		if i := slices.Index(f, "-"); i > 0 && i+1 < len(f) {
			typ = f[i+1] // the last one listed is on top
		}
	}
	return typ
}

// lowerOf is where pkg/volume mounts the streaming tree under the volume mounted at p.
func lowerOf(p string) string {
	return filepath.Join(filepath.Dir(p), "."+filepath.Base(p)+".cistern-lower")
}

// TestWritableStreaming: a writable volume of a StorageClass with dataMode streaming is staged
// as soon as its dataset is listed: an overlay on the volume's own filesystem whose lower layer
// is the streaming tree. Its files read byte-identical to S3 while the staging still runs;
// writes read back, stay in the volume (a second volume of the dataset sees none) and fill only
// the upper directory, up to the capacity (ENOSPC); a driver restart (the keeper handing the
// FUSE connection to the new process) leaves it readable; unstage takes the reference on the
// staged version and tears down the overlay, then the tree; a restage layers it on the cache
// with its changes; nothing is left at the end. A writable inline volume, and a static PV's
// per-pod copy, stream the same way and go with their unpublish.
func TestWritableStreaming(t *testing.T) {
	env, params, secrets, keeper := streamingEnv(t)
	ctx := context.Background()
	const capacity = 64 << 20
	spec := func() *datasource.Spec {
		pl, err := volume.ParseParams(params, cparams.StorageClass)
		if err != nil {
			t.Fatal(err)
		}
		return datasource.SpecOf(pl.Dataset)
	}()
	staged := func() bool { st, _, _ := env.driver.cache.Status("fast", spec); return st.Ready() }

	volA := env.create("stream-a", capacity, params)
	start := time.Now()
	stagingA, a := env.stageStreamed(volA, secrets)
	t.Logf("staged and published in %v", time.Since(start))
	if staged() {
		t.Fatal("the dataset was staged before the volume: the test needs a staging under way")
	}
	if typ := mountType(t, stagingA); typ != "overlay" {
		t.Errorf("staging path mount %q, want overlay", typ)
	}
	if typ := mountType(t, lowerOf(stagingA)); typ != "fuse.cistern-stream" {
		t.Errorf("lower layer mount %q, want the streaming tree", typ)
	}
	// The small files now (each read joins the staging, which fetches it next); weights.bin,
	// whose read waits for the staging's verified copy, after the restart.
	readAll := func(dir string, keys ...string) {
		t.Helper()
		for _, k := range keys {
			if got, err := os.ReadFile(filepath.Join(dir, k)); err != nil || !bytes.Equal(got, streamedFiles[k]) {
				t.Errorf("%s: %d bytes, err %v; want the %d bytes in S3", filepath.Join(dir, k), len(got), err, len(streamedFiles[k]))
			}
		}
	}
	readStreamed := func(dir string, keys ...string) {
		t.Helper()
		if staged() {
			t.Error("the staging ended before the reads: they did not overlap it")
		}
		readAll(dir, keys...)
	}
	readStreamed(a, "cfg/config.json", "cfg/tokenizer.md")
	if got := env.upperChanges(volA.VolumeId, "ext4"); len(got) != 0 {
		t.Errorf("a new volume's upper directory holds %v, want nothing", got)
	}

	// Writes read back; the upper directory holds exactly what changed.
	for k, v := range map[string]string{"cfg/config.json": `{"layers": 64}`, "out/result.txt": "trained"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(a, k)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(a, k), []byte(v), 0o644); err != nil {
			t.Fatalf("write %s: %v", k, err)
		}
	}
	if err := os.Remove(filepath.Join(a, "cfg", "tokenizer.md")); err != nil {
		t.Fatal(err)
	}
	changed := map[string]string{"cfg/config.json": `{"layers": 64}`, "out/result.txt": "trained"}
	checkFiles(t, a, changed)
	wantChanges := []string{"cfg dir", "cfg/config.json written", "cfg/tokenizer.md deleted", "out opaque", "out/result.txt written"}
	if got := env.upperChanges(volA.VolumeId, "ext4"); !slices.Equal(got, wantChanges) {
		t.Errorf("changes %v, want %v", got, wantChanges)
	}

	// A snapshot shares the version the volume references: not before the dataset is staged.
	_, err := env.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "stream-snap", SourceVolumeId: volA.VolumeId})
	wantCode(t, err, codes.Unavailable, "once the dataset is staged")

	// Capacity: writes past it get ENOSPC.
	n, err := fillUntilFull(t, filepath.Join(a, "fill"), capacity+(16<<20))
	if !errors.Is(err, unix.ENOSPC) || n > capacity {
		t.Fatalf("wrote %d bytes into a %d-byte volume, ending with %v; want ENOSPC within capacity", n, capacity, err)
	}
	if err := os.Remove(filepath.Join(a, "fill")); err != nil {
		t.Fatal(err)
	}

	// A second volume of the dataset sees none of A's writes.
	volB := env.create("stream-b", capacity, params)
	_, b := env.stageStreamed(volB, secrets)
	readStreamed(b, "cfg/config.json", "cfg/tokenizer.md")
	if _, err := os.Stat(filepath.Join(b, "out")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("volume B sees A's new directory: %v", err)
	}

	// A writable inline volume streams the same way.
	inline := filepath.Join(env.dir, "target", "inline-rw")
	ivc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "size": "64Mi"}
	for k, v := range params {
		if k != "pool" {
			ivc[k] = v
		}
	}
	if err := retryUnavailable(t, func() error {
		_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "inline-rw", TargetPath: inline,
			VolumeCapability: mountCap(""), VolumeContext: ivc, Secrets: secrets})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if typ := mountType(t, lowerOf(inline)); typ != "fuse.cistern-stream" {
		t.Errorf("inline lower layer mount %q, want the streaming tree", typ)
	}
	if err := os.WriteFile(filepath.Join(inline, "note"), []byte("x"), 0o644); err != nil {
		t.Errorf("write to a writable inline volume: %v", err)
	}
	checkFiles(t, inline, map[string]string{"cfg/config.json": string(streamedFiles["cfg/config.json"]), "note": "x"})
	if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "inline-rw", TargetPath: inline}); err != nil {
		t.Fatal(err)
	}
	if mounted(t, inline) || mounted(t, lowerOf(inline)) {
		t.Error("the inline volume, or its streaming tree, still mounted after unpublish")
	}

	// A static PV's writable per-pod copy too: the PV staged as the read-only streaming tree, the
	// copy layered on a streaming tree of its own, both gone with unpublish and unstage.
	pvc := map[string]string{"capacity": "48Mi"}
	for k, v := range params {
		pvc[k] = v
	}
	pvStaging, pvTarget := filepath.Join(env.dir, "staging", "pv-stream"), filepath.Join(env.dir, "target", "pv-stream")
	if err := retryUnavailable(t, func() error {
		_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "pv-stream", StagingTargetPath: pvStaging,
			VolumeCapability: mountCap(""), VolumeContext: pvc, Secrets: secrets})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "pv-stream", StagingTargetPath: pvStaging,
		TargetPath: pvTarget, VolumeCapability: mountCap(""), VolumeContext: pvc, Secrets: secrets}); err != nil {
		t.Fatal(err)
	}
	if typ := mountType(t, lowerOf(pvTarget)); typ != "fuse.cistern-stream" {
		t.Errorf("per-pod copy's lower layer mount %q, want the streaming tree", typ)
	}
	if err := os.WriteFile(filepath.Join(pvTarget, "note"), []byte("pod"), 0o644); err != nil {
		t.Errorf("write to a per-pod copy: %v", err)
	}
	readStreamed(pvTarget, "cfg/config.json")
	if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "pv-stream", TargetPath: pvTarget}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "pv-stream", StagingTargetPath: pvStaging}); err != nil {
		t.Fatal(err)
	}
	if mounted(t, pvTarget) || mounted(t, lowerOf(pvTarget)) || mounted(t, pvStaging) {
		t.Error("the per-pod copy, its streaming tree or the PV's still mounted after unpublish and unstage")
	}

	// A restart: the keeper hands the new process the FUSE connections; the overlays read on.
	restarted := time.Now()
	env.restart()
	t.Logf("restarted in %v", time.Since(restarted))
	if held, err := fusekeeper.List(keeper.Path()); err != nil || len(held) != 2 {
		t.Errorf("the keeper holds %v (%v), want the two volumes' trees", held, err)
	}
	checkFiles(t, a, changed)
	readStreamed(a, "weights.bin")
	readAll(b, "weights.bin", "cfg/tokenizer.md") // staged by now: A's read waited for it

	// Once staged, unstage takes the reference on the staged version, then the overlay goes,
	// then the tree; a restage layers the volume on the cache, changes kept.
	deadline := time.Now().Add(time.Minute)
	for !staged() && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if !staged() {
		t.Fatal("the dataset was not staged within a minute")
	}
	// The staged tree is S3's bytes: none of A's writes reached it.
	trees, _ := filepath.Glob(filepath.Join(cache.Dir(env.pools[0].path), "*", cache.TreeDir))
	if len(trees) != 1 {
		t.Fatalf("cached trees: %v", trees)
	}
	readAll(trees[0], "cfg/config.json", "cfg/tokenizer.md", "weights.bin")
	if _, err := os.Stat(filepath.Join(trees[0], "out")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("A's new directory is in the cache: %v", err)
	}
	for range 2 {
		env.unpublishAndUnstage(volA.VolumeId)
	}
	if mounted(t, stagingA) || mounted(t, a) || mounted(t, lowerOf(stagingA)) {
		t.Fatal("volume A, or its streaming tree, still mounted after unstage")
	}
	if _, err := os.Stat(lowerOf(stagingA)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the streaming tree's mount point is left: %v", err)
	}
	if v, _ := env.driver.volumes.Store().GetVolume(volA.VolumeId); v.DatasetStream || v.DatasetLayer == "" {
		t.Errorf("volume A after unstage: stream %v, layer %q; want layered on the staged version", v.DatasetStream, v.DatasetLayer)
	}
	stagingA, a = env.stageStreamed(volA, secrets)
	if typ := mountType(t, lowerOf(stagingA)); typ != "" {
		t.Errorf("restaged on a staged dataset, the volume still has a streaming tree (%s)", typ)
	}
	checkFiles(t, a, changed)
	if _, err := os.Stat(filepath.Join(a, "cfg", "tokenizer.md")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a deleted file is back after a restage: %v", err)
	}
	snap, err := env.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "stream-snap", SourceVolumeId: volA.VolumeId})
	if err != nil {
		t.Fatalf("CreateSnapshot of the volume on its staged version: %v", err)
	}
	if _, err := env.ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()}); err != nil {
		t.Fatal(err)
	}

	for _, v := range []*csi.Volume{volA, volB} {
		env.unpublishAndUnstage(v.VolumeId)
		if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.VolumeId}); err != nil {
			t.Fatal(err)
		}
	}
	if trees := env.driver.volumes.Store().ListTreeVolumes(); len(trees) != 0 {
		t.Errorf("streaming tree records left: %v", trees)
	}
	if held, _ := fusekeeper.List(keeper.Path()); len(held) != 0 {
		t.Errorf("the keeper still holds %v", held)
	}
	dirs, _ := filepath.Glob(filepath.Join(cache.Dir(env.pools[0].path), "*", cache.TreeDir))
	if len(dirs) != 1 {
		t.Fatalf("cached trees: %v", dirs)
	}
	checkNothingLeft(t, env, filepath.Dir(dirs[0]))
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(dirs[0]), datasource.StreamDir, "*")); len(left) != 0 {
		t.Errorf("scratch left: %v", left)
	}
}

// TestWriteBackStreaming: a writable inline volume with dataMode streaming that names an output
// target is layered on its streaming tree, its dataset staging at 1 MiB/s. Its NodeUnpublish
// answers Unavailable until the dataset is staged (the upload reads the version the volume was
// made on, which it then references), and then hands the volume to the upload: every change,
// and nothing unchanged, is at the target, and the volume and its tree are gone.
func TestWriteBackStreaming(t *testing.T) {
	testutil.RequireFUSE(t)
	env, s, proxy, _ := writeBackEnv(t)
	env.stop()
	env.cfg.Datasets.BandwidthBytesPerSec = 1 << 20
	env.start()
	s.Put(t, "shared", "set/big.bin", bytes.Repeat([]byte("weights!"), 6<<17)) // 6 MiB: staged in 5-6 s
	ctx := context.Background()
	vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://shared/set", "endpoint": proxy.URL,
		"pathStyle": "true", "size": "64Mi", "dataMode": "streaming", "outputTarget": "s3://out/stream"}
	owner := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	id, target := "wb-stream", filepath.Join(env.dir, "target", "wb-stream")
	if err := retryUnavailable(t, func() error {
		_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
			VolumeCapability: mountCap(""), VolumeContext: vc, Secrets: owner})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if typ := mountType(t, lowerOf(target)); typ != "fuse.cistern-stream" {
		t.Fatalf("lower layer mount %q, want the streaming tree", typ)
	}
	want := map[string][]byte{"out/metrics.json": []byte(`{"loss":0.1}`), "f0": []byte("changed")}
	writeOutputs(t, target, want)
	if err := os.Remove(filepath.Join(target, "f1")); err != nil {
		t.Fatal(err)
	}
	unavailable := 0
	if err := retryUnavailable(t, func() error {
		_, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		if status.Code(err) == codes.Unavailable {
			unavailable++
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if unavailable == 0 {
		t.Error("NodeUnpublish handed the volume off before its dataset was staged")
	}
	if mounted(t, target) || mounted(t, lowerOf(target)) {
		t.Error("the volume, or its streaming tree, still mounted after NodeUnpublish")
	}
	waitFor(t, "the volume to be uploaded and deleted", func() bool {
		_, ok := env.driver.volumes.Store().GetVolume(id)
		return !ok
	})
	checkOutputs(t, s, "stream/", want)
	if trees := env.driver.volumes.Store().ListTreeVolumes(); len(trees) != 0 {
		t.Errorf("streaming tree records left: %v", trees)
	}
}

// TestWritableStreamingFallsBackWithoutFUSE: on a node without FUSE a writable volume with
// dataMode streaming waits for its dataset and is layered on the cache, and the node is told
// why, naming the volume (an Event in the deployed driver).
func TestWritableStreamingFallsBackWithoutFUSE(t *testing.T) {
	env, src := layeredEnv(t, "ext4", volume.WritableDatasets{})
	var mu sync.Mutex
	var reasons []string
	env.stop()
	env.cfg.Streaming.FUSEDevice = filepath.Join(env.dir, "no-fuse")
	env.cfg.Streaming.OnFallback = func(id, _, reason string) {
		mu.Lock()
		defer mu.Unlock()
		reasons = append(reasons, id+": "+reason)
	}
	env.start()
	resp, err := env.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{
		Name: "fallback", CapacityRange: &csi.CapacityRange{RequiredBytes: 96 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("ext4")},
		Parameters:         map[string]string{"source": "file://" + src + "/set", "pool": "fast", "dataMode": "streaming"},
	})
	if err != nil {
		t.Fatal(err)
	}
	vol := resp.GetVolume()
	target := env.stagePublish(vol, "ext4")
	checkFiles(t, target, want)
	staging := filepath.Join(env.dir, "staging", vol.VolumeId)
	if typ := mountType(t, staging); typ != "overlay" {
		t.Errorf("staging path mount %q, want overlay", typ)
	}
	if mounted(t, lowerOf(staging)) {
		t.Error("a streaming tree was mounted on a node without FUSE")
	}
	if v, _ := env.driver.volumes.Store().GetVolume(vol.VolumeId); v.DatasetStream || v.DatasetLayer == "" {
		t.Errorf("volume: stream %v, layer %q; want layered on the cached version", v.DatasetStream, v.DatasetLayer)
	}
	mu.Lock()
	if len(reasons) == 0 || !strings.HasPrefix(reasons[0], vol.VolumeId+": ") || !strings.Contains(reasons[0], "no-fuse") {
		t.Errorf("fallbacks reported: %q, want one naming the volume and the missing device", reasons)
	}
	mu.Unlock()
	env.unpublishAndUnstage(vol.VolumeId)
	if _, err := env.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: vol.VolumeId}); err != nil {
		t.Fatal(err)
	}
}
