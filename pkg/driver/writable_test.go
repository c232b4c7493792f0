package driver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"github.com/cistern-csi/cistern/pkg/overlayfs"
	"github.com/cistern-csi/cistern/pkg/volume"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// The tests of writable dataset volumes layered on the cache (pkg/volume/layer.go): real loop
// devices, ext4 and xfs pools and volumes, real overlay mounts.

const bigSize = 48 << 20

// layeredEnv is a driver over one pool, a filesystem of poolFS, whose file:// sources may read
// src/set: the small files of want and big.bin, bigSize bytes.
func layeredEnv(t *testing.T, poolFS string, writable volume.WritableDatasets) (*testEnv, string) {
	env := startDriver(t, testPool{name: "fast", fs: poolFS, size: 2 << 30})
	src := filepath.Join(env.dir, "sources")
	writeTree(t, filepath.Join(src, "set"), want)
	big := make([]byte, bigSize)
	for i := range big {
		big[i] = byte(i*7 + i>>12)
	}
	if err := os.WriteFile(filepath.Join(src, "set", "big.bin"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	env.stop()
	env.cfg.Datasets.LocalSourceRoots = []string{src}
	env.cfg.Writable = writable
	env.start()
	return env, src
}

// writableVolume creates a volume of capacity bytes with a filesystem of fs of the dataset src/set.
func (e *testEnv) writableVolume(name, src, fs string, capacity int64) *csi.Volume {
	e.t.Helper()
	resp, err := e.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{
		Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: capacity},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap(fs)},
		Parameters:         map[string]string{"source": "file://" + src + "/set", "pool": "fast"},
	})
	if err != nil {
		e.t.Fatalf("CreateVolume %s: %v", name, err)
	}
	return resp.GetVolume()
}

// stagePublish stages and publishes vol (waiting out Unavailable) and returns its target.
func (e *testEnv) stagePublish(vol *csi.Volume, fs string) string {
	e.t.Helper()
	ctx := context.Background()
	staging, target := filepath.Join(e.dir, "staging", vol.VolumeId), filepath.Join(e.dir, "target", vol.VolumeId)
	if err := retryUnavailable(e.t, func() error {
		_, err := e.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId,
			StagingTargetPath: staging, VolumeCapability: mountCap(fs), VolumeContext: vol.VolumeContext})
		if err != nil {
			e.t.Logf("NodeStageVolume %s: %v", vol.VolumeId, err)
		}
		return err
	}); err != nil {
		e.t.Fatalf("NodeStageVolume %s: %v", vol.VolumeContext, err)
	}
	if _, err := e.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeId,
		StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap(fs), VolumeContext: vol.VolumeContext}); err != nil {
		e.t.Fatalf("NodePublishVolume: %v", err)
	}
	return target
}

// upperChanges mounts the volume's own filesystem (its loop device: the superblock its overlay
// uses) on a directory of its own, lists the changes of the upper directory there (what issue
// 26's write-back reads) as "path kind" strings, and unmounts it.
func (e *testEnv) upperChanges(id, fs string) []string {
	e.t.Helper()
	v, ok := e.driver.volumes.Store().GetVolume(id)
	if !ok || v.Device == "" {
		e.t.Fatalf("volume %s is not staged: %+v", id, v)
	}
	dir := e.t.TempDir()
	if err := unix.Mount(v.Device, dir, fs, 0, ""); err != nil {
		e.t.Fatalf("mount %s: %v", v.Device, err)
	}
	defer func() {
		if err := unix.Unmount(dir, 0); err != nil {
			e.t.Errorf("unmount %s: %v", dir, err)
		}
	}()
	cs, err := overlayfs.Changes(filepath.Join(dir, volume.LayerUpperDir))
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, c := range cs {
		out = append(out, c.Path+" "+string(c.Kind))
	}
	return out
}

func fileSum(t *testing.T, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func usedBytes(t *testing.T, p string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

// fillUntilFull writes to a new file at p in 1 MiB chunks until a write fails; it returns the
// bytes written and the error.
func fillUntilFull(t *testing.T, p string, limit int64) (int64, error) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte{0xab}, 1<<20)
	var n int64
	for n <= limit {
		w, err := f.Write(chunk)
		n += int64(w)
		if err != nil {
			return n, err
		}
	}
	return n, f.Sync()
}

// TestWritableLayered: a writable volume of a cached dataset is an overlay on the cache, on ext4
// and xfs pools and volume filesystems: ready with nothing copied, capacity enforced (ENOSPC),
// its writes invisible to a second volume of the dataset and to the cache, its deletions
// whiteouts in the upper directory; it survives a restage, a driver restart, a snapshot restore;
// its RPCs are idempotent; and nothing is left once every volume is gone.
func TestWritableLayered(t *testing.T) {
	for _, tc := range []struct {
		poolFS, volFS string
		capacity      int64
	}{
		{"ext4", "ext4", 96 << 20},
		{"xfs", "xfs", 320 << 20}, // xfs's smallest filesystem is 300 MB
		{"xfs", "ext4", 96 << 20},
	} {
		t.Run(tc.poolFS+"-pool/"+tc.volFS+"-volume", func(t *testing.T) {
			testWritableLayered(t, tc.poolFS, tc.volFS, tc.capacity)
		})
	}
}

func testWritableLayered(t *testing.T, poolFS, volFS string, capacity int64) {
	env, src := layeredEnv(t, poolFS, volume.WritableDatasets{})
	ctx := context.Background()
	pool := env.pools[0].path
	volA := env.writableVolume("layer-a", src, volFS, capacity)
	a := env.stagePublish(volA, volFS)

	// Ready without a copy: the data is the cache's, the volume's filesystem holds none of it.
	trees, _ := filepath.Glob(filepath.Join(cache.Dir(pool), "*", cache.TreeDir))
	if len(trees) != 1 {
		t.Fatalf("cached trees: %v", trees)
	}
	tree := trees[0]
	checkFiles(t, a, want)
	if fileSum(t, filepath.Join(a, "big.bin")) != fileSum(t, filepath.Join(src, "set", "big.bin")) {
		t.Fatal("big.bin differs from its source")
	}
	if got := env.upperChanges(volA.VolumeId, volFS); len(got) != 0 {
		t.Fatalf("a new volume's upper directory holds %v, want nothing", got)
	}
	var inVol, inCache unix.Stat_t
	_ = unix.Stat(filepath.Join(a, "big.bin"), &inVol)
	_ = unix.Stat(filepath.Join(tree, "big.bin"), &inCache)
	if inVol.Ino != inCache.Ino {
		t.Errorf("big.bin in the volume is inode %d, the cache's is %d: a copy", inVol.Ino, inCache.Ino)
	}
	if refs, _ := os.ReadDir(filepath.Join(filepath.Dir(tree), cache.RefsDir)); len(refs) != 1 {
		t.Errorf("the cached dataset has %d references, want 1 (the volume's)", len(refs))
	}

	// Capacity: writes past it get ENOSPC.
	n, err := fillUntilFull(t, filepath.Join(a, "fill"), capacity+(16<<20))
	if !errors.Is(err, unix.ENOSPC) || n > capacity {
		t.Fatalf("wrote %d bytes into a %d-byte volume, ending with %v; want ENOSPC within capacity", n, capacity, err)
	}
	if err := os.Remove(filepath.Join(a, "fill")); err != nil {
		t.Fatal(err)
	}

	// Changes: a write, a deletion, a new file, and an owner change of the big file (kubelet's
	// fsGroup chown) that copies up its metadata only.
	if err := os.WriteFile(filepath.Join(a, "a.txt"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(a, "d", "b.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a, "new.txt"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := usedBytes(t, a)
	if err := os.Chown(filepath.Join(a, "big.bin"), 0, 1234); err != nil {
		t.Fatal(err)
	}
	if grew := usedBytes(t, a) - before; grew > 1<<20 {
		t.Errorf("chown of big.bin took %d bytes of the volume: its data was copied up", grew)
	}
	wantChanges := []string{"a.txt written", "big.bin metadata", "d dir", "d/b.txt deleted", "new.txt written"}
	if got := env.upperChanges(volA.VolumeId, volFS); !slices.Equal(got, wantChanges) {
		t.Errorf("changes %v, want %v", got, wantChanges)
	}

	// A second volume of the dataset, and the cache, see none of it.
	volB := env.writableVolume("layer-b", src, volFS, capacity)
	b := env.stagePublish(volB, volFS)
	checkFiles(t, b, want)
	checkFiles(t, tree, want)
	for _, dir := range []string{b, tree} {
		if _, err := os.Stat(filepath.Join(dir, "new.txt")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("new.txt in %s: %v", dir, err)
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(dir, "big.bin"), &st); err != nil || st.Gid == 1234 {
			t.Errorf("big.bin in %s changed owner (%v)", dir, err)
		}
	}

	// Expansion grows the volume's own filesystem under its overlay: xfs_growfs needs it by a
	// mount point the overlay hides. (ext4 grows online only with CAP_SYS_RESOURCE, which some
	// sandboxes drop: TestOnlineExpansion skips it there too.)
	if volFS == "xfs" || hasCapSysResource(t) {
		growLayered(t, env, volB, b, capacity, volFS)
	}

	// Idempotent RPCs, and a driver restart: the mounts and records carry on.
	stagingA := filepath.Join(env.dir, "staging", volA.VolumeId)
	if _, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: volA.VolumeId, StagingTargetPath: stagingA,
		VolumeCapability: mountCap(volFS), VolumeContext: volA.VolumeContext}); err != nil {
		t.Fatalf("repeated NodeStageVolume: %v", err)
	}
	if _, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: volA.VolumeId, StagingTargetPath: stagingA,
		TargetPath: a, VolumeCapability: mountCap(volFS), VolumeContext: volA.VolumeContext}); err != nil {
		t.Fatalf("repeated NodePublishVolume: %v", err)
	}
	env.restart()
	checkFiles(t, a, map[string]string{"a.txt": "changed", "new.txt": "new"})
	for range 2 {
		env.unpublishAndUnstage(volA.VolumeId)
	}
	if mounted(t, stagingA) || mounted(t, a) {
		t.Fatal("volume A still mounted after unstage")
	}
	// Restaged: the overlay again, on the version the volume references.
	a = env.stagePublish(volA, volFS)
	checkFiles(t, a, map[string]string{"a.txt": "changed", "new.txt": "new", "d/e/c.txt": "gamma"})
	if _, err := os.Stat(filepath.Join(a, "d", "b.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a deleted file is back after a restage: %v", err)
	}

	// A snapshot and a restore share the lower layer: the restored volume shows A's changes on
	// the dataset, and outlives A. Not on xfs pools: there an image shares its extents with its
	// snapshot (a reflink), and its loop device then has 4 KiB sectors, which the volume's
	// filesystem, made on 512-byte ones, cannot be mounted on, layered or not (left for the
	// image package).
	volC, snapID := (*csi.Volume)(nil), ""
	if poolFS == "ext4" {
		volC, snapID = restoreLayered(t, env, volA, src, volFS, capacity)
	} else {
		env.unpublishAndUnstage(volA.VolumeId)
		if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: volA.VolumeId}); err != nil {
			t.Fatal(err)
		}
	}

	// Everything gone: no mount, loop device or reference left.
	for _, v := range []*csi.Volume{volB, volC} {
		if v == nil {
			continue
		}
		env.unpublishAndUnstage(v.VolumeId)
		if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.VolumeId}); err != nil {
			t.Fatal(err)
		}
	}
	if snapID != "" {
		if _, err := env.ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snapID}); err != nil {
			t.Fatal(err)
		}
	}
	checkNothingLeft(t, env, filepath.Dir(tree))
}

// restoreLayered snapshots the layered, staged volume A, restores the snapshot as a new volume,
// deletes A and checks that the restored volume shows A's changes on the dataset. It returns the
// restored volume (staged and published) and the snapshot.
func restoreLayered(t *testing.T, env *testEnv, volA *csi.Volume, src, volFS string, capacity int64) (*csi.Volume, string) {
	ctx := context.Background()
	snap, err := env.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "layer-snap", SourceVolumeId: volA.VolumeId})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "layer-c", CapacityRange: &csi.CapacityRange{RequiredBytes: capacity},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap(volFS)}, Parameters: map[string]string{"source": "file://" + src + "/set", "pool": "fast"},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.Snapshot.SnapshotId}}}})
	if err != nil {
		t.Fatal(err)
	}
	volC := resp.Volume
	env.unpublishAndUnstage(volA.VolumeId)
	if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: volA.VolumeId}); err != nil {
		t.Fatal(err)
	}
	c := env.stagePublish(volC, volFS)
	checkFiles(t, c, map[string]string{"a.txt": "changed", "new.txt": "new", "d/e/c.txt": "gamma"})
	if fileSum(t, filepath.Join(c, "big.bin")) != fileSum(t, filepath.Join(src, "set", "big.bin")) {
		t.Error("big.bin of the restored volume differs")
	}

	return volC, snap.Snapshot.SnapshotId
}

// growLayered expands the layered volume vol, published at target, by 256 MiB and checks that
// its filesystem grew and its data stayed.
func growLayered(t *testing.T, env *testEnv, vol *csi.Volume, target string, capacity int64, volFS string) {
	t.Helper()
	ctx := context.Background()
	before := statfsTotal(t, target)
	grown := capacity + 256<<20
	if _, err := env.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol.VolumeId,
		CapacityRange: &csi.CapacityRange{RequiredBytes: grown}}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol.VolumeId, VolumePath: target,
		StagingTargetPath: filepath.Join(env.dir, "staging", vol.VolumeId), VolumeCapability: mountCap(volFS)}); err != nil {
		t.Fatalf("NodeExpandVolume: %v", err)
	}
	if after := statfsTotal(t, target); after < before+200<<20 {
		t.Errorf("the layered volume grew from %d to %d bytes only", before, after)
	}
	checkFiles(t, target, want)
}

// mounted says whether p is a mount point.
func mounted(t *testing.T, p string) bool {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == p {
			return true
		}
	}
	return false
}

// checkNothingLeft fails when a mount under the driver's directory, a loop device of an image in
// the pool, or a reference on the cached dataset in datasetDir is left.
func checkNothingLeft(t *testing.T, env *testEnv, datasetDir string) {
	t.Helper()
	data, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], env.dir+"/") {
			t.Errorf("mount left: %s", f[4])
		}
	}
	out, _ := testutil.RunAllowFail("losetup", "--noheadings", "--output", "NAME,BACK-FILE", "--list")
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && strings.HasPrefix(f[1], env.pools[0].path+"/") {
			t.Errorf("loop device left: %s", line)
		}
	}
	if refs, _ := os.ReadDir(filepath.Join(datasetDir, cache.RefsDir)); len(refs) != 0 {
		t.Errorf("%d references left on the cached dataset", len(refs))
	}
	if vols := env.driver.volumes.Store().ListVolumes(); len(vols) != 0 {
		t.Errorf("volume records left: %v", vols)
	}
}

// TestWritableLayerFallback: where the overlay cannot be mounted (a kernel without overlayfs,
// played by a failing mount), a writable dataset volume is filled with a copy and the node is
// told why; with --writable-datasets=copy it is copied without trying. Either way it holds no
// reference on the cache and leaves nothing behind.
func TestWritableLayerFallback(t *testing.T) {
	for _, tc := range []struct {
		name     string
		copyMode bool
		reported bool
	}{{"overlayfs missing", false, true}, {"copy asked for", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			var reasons []string
			env, src := layeredEnv(t, "ext4", volume.WritableDatasets{
				Copy:         tc.copyMode,
				OnCopy:       func(id, ds, reason string) { reasons = append(reasons, reason) },
				OverlayMount: func(string, string) error { return unix.ENODEV },
			})
			vol := env.writableVolume("copied", src, "ext4", 96<<20)
			target := env.stagePublish(vol, "ext4")
			checkFiles(t, target, want)
			wantReady(t, env.driver, map[string]uint64{"copy": 1})
			if fileSum(t, filepath.Join(target, "big.bin")) != fileSum(t, filepath.Join(src, "set", "big.bin")) {
				t.Fatal("big.bin differs from its source")
			}
			if tc.reported != (len(reasons) == 1 && strings.Contains(reasons[0], "no such device")) {
				t.Errorf("reported %q", reasons)
			}
			v, _ := env.driver.volumes.Store().GetVolume(vol.VolumeId)
			if !v.DatasetFilled || v.DatasetLayer != "" {
				t.Errorf("record %+v: want a filled, unlayered volume", v)
			}
			if _, err := os.Stat(filepath.Join(target, volume.LayerUpperDir)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the copied volume shows the layer's directories: %v", err)
			}
			if err := os.WriteFile(filepath.Join(target, "a.txt"), []byte("changed"), 0o644); err != nil {
				t.Fatal(err)
			}
			trees, _ := filepath.Glob(filepath.Join(cache.Dir(env.pools[0].path), "*", cache.TreeDir))
			checkFiles(t, trees[0], want)
			env.unpublishAndUnstage(vol.VolumeId)
			if _, err := env.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: vol.VolumeId}); err != nil {
				t.Fatal(err)
			}
			checkNothingLeft(t, env, filepath.Dir(trees[0]))
		})
	}
}

// TestWritableLayerProvesAccess, through a real S3 server: a bucket policy lets anyone list the
// bucket and read one of its objects. A writable volume staged with the owner's credentials is
// layered on the cached dataset; a second one of the same dataset staged without credentials is
// refused (PermissionDenied) on every attempt, gets no overlay and no reference on the cache.
func TestWritableLayerProvesAccess(t *testing.T) {
	env := startDriver(t, testPool{name: "fast", size: 1 << 30})
	ctx := context.Background()
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "shared")
	for i := range 5 {
		s.Put(t, "shared", fmt.Sprintf("set/f%02d", i), []byte(strings.Repeat("team data ", 50+i)))
	}
	policy := `{"Version":"2012-10-17","Statement":[` +
		`{"Effect":"Allow","Principal":"*","Action":["s3:ListBucket"],"Resource":["arn:aws:s3:::shared"]},` +
		`{"Effect":"Allow","Principal":"*","Action":["s3:GetObject"],"Resource":["arn:aws:s3:::shared/set/f03"]}]}`
	if _, err := s.Client.PutBucketPolicy(ctx, &s3.PutBucketPolicyInput{Bucket: aws.String("shared"), Policy: aws.String(policy)}); err != nil {
		t.Fatal(err)
	}
	params := map[string]string{"source": "s3://shared/set", "endpoint": s.Endpoint, "pathStyle": "true", "pool": "fast"}
	owner := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	stage := func(vol *csi.Volume, secrets map[string]string) error {
		return retryUnavailable(t, func() error {
			_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId,
				StagingTargetPath: filepath.Join(env.dir, "staging", vol.VolumeId), VolumeCapability: mountCap(""),
				VolumeContext: vol.VolumeContext, Secrets: secrets})
			return err
		})
	}
	ownerVol, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "owner", CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}, Parameters: params, Secrets: owner})
	if err != nil {
		t.Fatal(err)
	}
	if err := stage(ownerVol.Volume, owner); err != nil {
		t.Fatal(err)
	}
	if !isOverlayMount(t, filepath.Join(env.dir, "staging", ownerVol.Volume.VolumeId)) {
		t.Fatal("the owner's volume is not layered")
	}
	other := env.create("other", 32<<20, params)
	for i := range 5 {
		if err := stage(other, nil); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("attempt %d: %v, want PermissionDenied", i+1, err)
		}
	}
	if mounted(t, filepath.Join(env.dir, "staging", other.VolumeId)) {
		t.Error("the refused volume's staging path is mounted")
	}
	refs, _ := filepath.Glob(filepath.Join(cache.Dir(env.pools[0].path), "*", cache.RefsDir, "*"))
	if len(refs) != 1 {
		t.Errorf("%d references on the cached dataset, want 1 (the owner's volume)", len(refs))
	}
}

func isOverlayMount(t *testing.T, p string) bool {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Type == 0x794c7630
}

// TestWritableLayerInterrupted: a volume whose layer was recorded but never mounted (the node
// plugin died between the two) is layered again from the start, its access proof first, at the
// next staging: Aborted once, then layered, with one reference.
func TestWritableLayerInterrupted(t *testing.T) {
	env, src := layeredEnv(t, "ext4", volume.WritableDatasets{})
	vol := env.writableVolume("interrupted", src, "ext4", 96<<20)
	v, _ := env.driver.volumes.Store().GetVolume(vol.VolumeId)
	v.DatasetLayer = "not-referenced"
	if err := env.driver.volumes.Store().PutVolume(v); err != nil {
		t.Fatal(err)
	}
	staging := filepath.Join(env.dir, "staging", vol.VolumeId)
	_, err := env.node.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId,
		StagingTargetPath: staging, VolumeCapability: mountCap("ext4"), VolumeContext: vol.VolumeContext})
	if status.Code(err) != codes.Aborted || mounted(t, staging) {
		t.Fatalf("first staging: %v (mounted %v), want Aborted and nothing mounted", err, mounted(t, staging))
	}
	target := env.stagePublish(vol, "ext4")
	checkFiles(t, target, want)
	if !isOverlayMount(t, target) {
		t.Error("not layered after the retry")
	}
	trees, _ := filepath.Glob(filepath.Join(cache.Dir(env.pools[0].path), "*", cache.TreeDir))
	env.unpublishAndUnstage(vol.VolumeId)
	if _, err := env.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: vol.VolumeId}); err != nil {
		t.Fatal(err)
	}
	checkNothingLeft(t, env, filepath.Dir(trees[0]))
}

// TestWritableLayerKeepsItsVersion: a layered volume keeps the dataset version it was made on.
// When the source changes, a new volume gets the new version (the old one moves aside, kept or
// retired, never deleted: the first volume references it), and the first volume, unstaged and
// staged again, still shows the old bytes; no reference outlives the volumes.
func TestWritableLayerKeepsItsVersion(t *testing.T) {
	env, src := layeredEnv(t, "ext4", volume.WritableDatasets{})
	ctx := context.Background()
	oldVol := env.writableVolume("old", src, "ext4", 96<<20)
	env.stagePublish(oldVol, "ext4")
	time.Sleep(10 * time.Millisecond) // a new mtime
	writeTree(t, filepath.Join(src, "set"), map[string]string{"a.txt": "alpha, version 2"})
	newVol := env.writableVolume("new", src, "ext4", 96<<20)
	checkFiles(t, env.stagePublish(newVol, "ext4"), map[string]string{"a.txt": "alpha, version 2"})
	kept, _ := filepath.Glob(filepath.Join(cache.Dir(env.pools[0].path), "*"+cache.VersionSep+"*"))
	retired, _ := filepath.Glob(filepath.Join(cache.Dir(env.pools[0].path), "*"+cache.RetiredSep+"*"))
	aside := append(kept, retired...)
	if len(aside) != 1 {
		t.Fatalf("versions moved aside: %v, want the old volume's", aside)
	}
	env.unpublishAndUnstage(oldVol.VolumeId)
	checkFiles(t, env.stagePublish(oldVol, "ext4"), map[string]string{"a.txt": "alpha", "d/b.txt": "beta"})
	for _, v := range []*csi.Volume{oldVol, newVol} {
		env.unpublishAndUnstage(v.VolumeId)
		if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.VolumeId}); err != nil {
			t.Fatal(err)
		}
	}
	// A retired version goes with its last reference; a kept one stays cached, unreferenced.
	if refs, _ := filepath.Glob(filepath.Join(aside[0], cache.RefsDir, "*")); len(refs) != 0 {
		t.Errorf("references outlived their volumes: %v", refs)
	}
	if len(retired) == 1 {
		if left, _ := filepath.Glob(retired[0]); len(left) != 0 {
			t.Errorf("the retired version outlived its last volume: %v", left)
		}
	}
	trees, _ := filepath.Glob(filepath.Join(cache.Dir(env.pools[0].path), "*", cache.TreeDir))
	checkNothingLeft(t, env, filepath.Dir(trees[0]))
}
