package driver

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cistern-csi/cistern/pkg/ids"
	"github.com/cistern-csi/cistern/test/testutil"
)

func testutilRoot(t *testing.T) { testutil.RequireRoot(t) }

// writeUntilFull writes 1 MiB blocks until an error and returns bytes written and the error.
func writeUntilFull(path string, limit int64) (int64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := bytes.Repeat([]byte{0xab}, 1<<20)
	var n int64
	for n < limit {
		w, err := f.Write(buf)
		n += int64(w)
		if err != nil {
			return n, err
		}
	}
	return n, f.Sync()
}

func TestCapacityIsEnforced(t *testing.T) {
	testutilRoot(t)
	env := startDriver(t, testPool{name: "fast"})
	v := env.create("small", 32*mb, nil)
	target := env.stageAndPublish(v.GetVolumeId(), mountCap("ext4"))
	n, err := writeUntilFull(filepath.Join(target, "big"), 64*mb)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("writing past 32 MiB: wrote %d bytes, err %v; want ENOSPC", n, err)
	}
	if n > 32*mb {
		t.Fatalf("wrote %d bytes into a 32 MiB volume", n)
	}
	stats, err := env.node.NodeGetVolumeStats(context.Background(), &csi.NodeGetVolumeStatsRequest{VolumeId: v.GetVolumeId(), VolumePath: target})
	if err != nil {
		t.Fatal(err)
	}
	if u := stats.GetUsage()[0]; u.GetAvailable() > mb || u.GetTotal() > 32*mb {
		t.Fatalf("stats of a full volume: %+v", u)
	}
	env.unpublishAndUnstage(v.GetVolumeId())
	if _, err := env.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
}

func TestReadOnlyPublish(t *testing.T) {
	testutilRoot(t)
	env := startDriver(t, testPool{name: "fast"})
	v := env.create("ro", 32*mb, nil)
	id := v.GetVolumeId()
	staging := filepath.Join(env.dir, "staging", id)
	if _, err := env.node.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: mountCap("")}); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(env.dir, "ro-target")
	if _, err := env.node.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: mountCap(""), Readonly: true}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "x"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write to read-only publish: %v, want EROFS", err)
	}
	if _, err := env.node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	// Deleting a volume that is still staged is refused.
	_, err := env.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: id})
	wantCode(t, err, codes.FailedPrecondition, "staged")
}

func TestBlockVolume(t *testing.T) {
	testutilRoot(t)
	env := startDriver(t, testPool{name: "fast"})
	resp, err := env.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "blk",
		CapacityRange: &csi.CapacityRange{RequiredBytes: 8 * mb}, VolumeCapabilities: []*csi.VolumeCapability{blockCap()}})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	target := env.stageAndPublish(id, blockCap())
	var st unix.Stat_t
	if err := unix.Stat(target, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		t.Fatalf("target is not a block device: %v mode %o", err, st.Mode)
	}
	stats, err := env.node.NodeGetVolumeStats(context.Background(), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
	if err != nil || stats.GetUsage()[0].GetTotal() != 8*mb {
		t.Fatalf("block stats: %v %v", stats, err)
	}
	// A mount capability on a block volume is refused.
	_, err = env.node.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: id,
		StagingTargetPath: filepath.Join(env.dir, "staging", id), TargetPath: filepath.Join(env.dir, "other"), VolumeCapability: mountCap("")})
	wantCode(t, err, codes.InvalidArgument, "block")
	env.unpublishAndUnstage(id)
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Fatalf("block target file left behind: %v", err)
	}
}

// hasCapSysResource reports whether this process may grow ext4 online (some sandboxes drop it).
func hasCapSysResource(t *testing.T) bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	var eff uint64
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "CapEff:") {
			eff, _ = strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(line, "CapEff:")), 16, 64)
		}
	}
	return eff&(1<<unix.CAP_SYS_RESOURCE) != 0
}

func TestOnlineExpansion(t *testing.T) {
	testutilRoot(t)
	for _, fs := range []string{"ext4", "xfs"} {
		t.Run(fs, func(t *testing.T) {
			if fs == "ext4" && !hasCapSysResource(t) {
				t.Skip("ext4 online resize needs CAP_SYS_RESOURCE, which this machine does not grant; TestOfflineExpansion covers ext4")
			}
			env := startDriver(t, testPool{name: "fast"})
			ctx := context.Background()
			resp, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "grow", CapacityRange: &csi.CapacityRange{RequiredBytes: 32 * mb},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap(fs)}})
			if err != nil {
				t.Fatal(err)
			}
			id := resp.GetVolume().GetVolumeId()
			target := env.stageAndPublish(id, mountCap(fs))
			if err := os.WriteFile(filepath.Join(target, "keep"), []byte("data"), 0o644); err != nil {
				t.Fatal(err)
			}
			before := statfsTotal(t, target)
			newSize := resp.GetVolume().GetCapacityBytes() + 256*mb
			ex, err := env.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: newSize}})
			if err != nil || !ex.GetNodeExpansionRequired() || ex.GetCapacityBytes() != newSize {
				t.Fatalf("ControllerExpandVolume: %v %v", ex, err)
			}
			// A resizer that lost the answer asks again: the filesystem has not grown yet, so
			// the node's expansion is still required.
			ex, err = env.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: newSize}})
			if err != nil || !ex.GetNodeExpansionRequired() || ex.GetCapacityBytes() != newSize {
				t.Fatalf("ControllerExpandVolume repeated: %v %v", ex, err)
			}
			nex, err := env.node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target,
				StagingTargetPath: filepath.Join(env.dir, "staging", id), VolumeCapability: mountCap(fs)})
			if err != nil || nex.GetCapacityBytes() != newSize {
				t.Fatalf("NodeExpandVolume: %v %v", nex, err)
			}
			if after := statfsTotal(t, target); after < before+200*mb {
				t.Fatalf("filesystem grew from %d to %d only", before, after)
			}
			if data, err := os.ReadFile(filepath.Join(target, "keep")); err != nil || string(data) != "data" {
				t.Fatalf("data after expansion: %q %v", data, err)
			}
			env.unpublishAndUnstage(id)
		})
	}
}

// TestOfflineExpansion grows a volume while it is not staged; the next stage grows its
// filesystem (offline for ext4 when online growth is not permitted).
func TestOfflineExpansion(t *testing.T) {
	testutilRoot(t)
	env := startDriver(t, testPool{name: "fast"})
	ctx := context.Background()
	v := env.create("grow-offline", 32*mb, nil)
	id := v.GetVolumeId()
	target := env.stageAndPublish(id, mountCap(""))
	if err := os.WriteFile(filepath.Join(target, "keep"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	env.unpublishAndUnstage(id)
	if _, err := env.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 128 * mb}}); err != nil {
		t.Fatal(err)
	}
	target = env.stageAndPublish(id, mountCap(""))
	if total := statfsTotal(t, target); total < 100*mb {
		t.Fatalf("filesystem is %d bytes after growing to 128 MiB", total)
	}
	if data, err := os.ReadFile(filepath.Join(target, "keep")); err != nil || string(data) != "data" {
		t.Fatalf("data after expansion: %q %v", data, err)
	}
	env.unpublishAndUnstage(id)
}

func statfsTotal(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks) * int64(st.Bsize)
}

func TestSnapshotRestoreAndClone(t *testing.T) {
	testutilRoot(t)
	env := startDriver(t, testPool{name: "fast"})
	ctx := context.Background()
	src := env.create("src", 32*mb, nil)
	target := env.stageAndPublish(src.GetVolumeId(), mountCap(""))
	if err := os.WriteFile(filepath.Join(target, "model.bin"), []byte("weights v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	snap, err := env.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: src.GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	// Writes after the snapshot do not reach it.
	if err := os.WriteFile(filepath.Join(target, "model.bin"), []byte("weights v2"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		source *csi.VolumeContentSource
		want   string
	}{
		{"from-snapshot", &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}}, "weights v1"},
		{"clone", &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.GetVolumeId()}}}, "weights v2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "clone" {
				// Flush the source's filesystem so the clone sees the second write.
				syncFilesystem(target)
			}
			resp, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: tc.name, CapacityRange: &csi.CapacityRange{RequiredBytes: 96 * mb},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}, VolumeContentSource: tc.source})
			if err != nil {
				t.Fatal(err)
			}
			id := resp.GetVolume().GetVolumeId()
			got := env.stageAndPublish(id, mountCap(""))
			data, err := os.ReadFile(filepath.Join(got, "model.bin"))
			if err != nil || string(data) != tc.want {
				t.Fatalf("restored content %q, %v; want %q", data, err, tc.want)
			}
			if total := statfsTotal(t, got); total < 80*mb {
				t.Fatalf("filesystem not grown to the larger volume: %d bytes", total)
			}
			env.unpublishAndUnstage(id)
		})
	}
}

// TestRestoreOfSnapshotOnAnotherNode: a snapshot ID names the node that holds it. Another
// node asked to restore it answers ResourceExhausted (external-provisioner then lets the
// scheduler pick again, instead of retrying the wrong node for ever); an ID that names this
// node, or none, and is not here is NotFound, as csi-sanity expects.
func TestRestoreOfSnapshotOnAnotherNode(t *testing.T) {
	env := startDriver(t, testPool{name: "fast"})
	src := env.create("src", 16*mb, nil)
	snap, err := env.ctrl.CreateSnapshot(context.Background(), &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: src.GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	id := snap.GetSnapshot().GetSnapshotId()
	if got := ids.NodeOfSnapshotID(id); got != "node-1" {
		t.Fatalf("snapshot %s names node %q, want node-1", id, got)
	}
	restore := func(snapshotID string) error {
		_, err := env.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "restore-" + snapshotID,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 16 * mb}, VolumeCapabilities: []*csi.VolumeCapability{mountCap("")},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
				Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snapshotID}}}})
		return err
	}
	hex := strings.TrimSuffix(strings.TrimPrefix(id, "fast-snap-"), "_node-1")
	wantCode(t, restore("fast-snap-"+hex+"_node-2"), codes.ResourceExhausted, "on node node-2, not on node node-1")
	wantCode(t, restore("fast-snap-"+strings.Repeat("0", 32)+"_node-1"), codes.NotFound, "does not exist")
	wantCode(t, restore("fast-snap-"+strings.Repeat("0", 32)), codes.NotFound, "does not exist")
	wantCode(t, restore("some-snapshot_node-2"), codes.NotFound, "does not exist")
	if err := restore(id); err != nil {
		t.Fatalf("restore on the snapshot's node: %v", err)
	}
}

func TestConcurrentCallsOnOneVolumeAreAborted(t *testing.T) {
	env := startDriver(t, testPool{name: "fast"})
	a := env.create("a", 16*mb, nil)
	b := env.create("b", 16*mb, nil)
	// A slow operation holds volume a.
	release, err := env.driver.locks.acquire(volumeKey(a.GetVolumeId()))
	if err != nil {
		t.Fatal(err)
	}
	_, err = env.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: a.GetVolumeId()})
	wantCode(t, err, codes.Aborted, "in progress")
	_, err = env.node.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: a.GetVolumeId(),
		StagingTargetPath: filepath.Join(env.dir, "s"), VolumeCapability: mountCap("")})
	wantCode(t, err, codes.Aborted, "")
	// Other volumes are not blocked.
	if _, err := env.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: b.GetVolumeId()}); err != nil {
		t.Fatalf("unrelated volume blocked: %v", err)
	}
	release()
	if _, err := env.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: a.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}

	// Many concurrent CreateVolume calls for one name: one volume, others succeed or abort.
	var wg sync.WaitGroup
	ids := make(chan string, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := env.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "same",
				CapacityRange: &csi.CapacityRange{RequiredBytes: 16 * mb}, VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}})
			if err == nil {
				ids <- resp.GetVolume().GetVolumeId()
			} else if c := status.Code(err); c != codes.Aborted {
				t.Errorf("concurrent CreateVolume: %v", err)
			}
		}()
	}
	wg.Wait()
	close(ids)
	seen := map[string]bool{}
	for id := range ids {
		seen[id] = true
	}
	if len(seen) != 1 || len(env.driver.volumes.Store().ListVolumes()) != 1 {
		t.Fatalf("concurrent creates made volumes %v (store has %d)", seen, len(env.driver.volumes.Store().ListVolumes()))
	}
}

func TestRestartKeepsServingVolumes(t *testing.T) {
	testutilRoot(t)
	env := startDriver(t, testPool{name: "fast"})
	v := env.create("persist", 32*mb, nil)
	id := v.GetVolumeId()
	target := env.stageAndPublish(id, mountCap(""))
	if err := os.WriteFile(filepath.Join(target, "f"), []byte("survives"), 0o644); err != nil {
		t.Fatal(err)
	}
	// An interrupted CreateVolume: a record that never became ready.
	rec := env.driver.volumes.Store().ListVolumes()[0]
	rec.ID, rec.Name, rec.Ready = ids.NewVolumeID("fast"), "half-made", false
	rec.StagingPath, rec.Device, rec.Published = "", "", nil
	if err := env.driver.volumes.Store().PutVolume(rec); err != nil {
		t.Fatal(err)
	}

	env.restart()

	if data, err := os.ReadFile(filepath.Join(target, "f")); err != nil || string(data) != "survives" {
		t.Fatalf("mount lost across restart: %q %v", data, err)
	}
	if _, ok := env.driver.volumes.Store().GetVolumeByName("half-made"); ok {
		t.Fatal("interrupted volume not cleaned at start")
	}
	list, err := env.ctrl.ListVolumes(context.Background(), &csi.ListVolumesRequest{})
	if err != nil || len(list.GetEntries()) != 1 || list.GetEntries()[0].GetVolume().GetVolumeId() != id {
		t.Fatalf("ListVolumes after restart: %v %v", list, err)
	}
	// Idempotent re-stage after restart, then the normal teardown.
	if _, err := env.node.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: id,
		StagingTargetPath: filepath.Join(env.dir, "staging", id), VolumeCapability: mountCap("")}); err != nil {
		t.Fatalf("re-stage after restart: %v", err)
	}
	env.unpublishAndUnstage(id)
	if _, err := env.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
}

// TestRestartForgetsLostMounts: mounts that vanished while the driver was down (a reboot) do
// not keep the volume marked staged, so it can still be deleted.
func TestRestartForgetsLostMounts(t *testing.T) {
	testutilRoot(t)
	env := startDriver(t, testPool{name: "fast"})
	v := env.create("lost", 32*mb, nil)
	id := v.GetVolumeId()
	target := env.stageAndPublish(id, mountCap(""))
	env.stop()
	testutil.Run(t, "umount", target)
	testutil.Run(t, "umount", filepath.Join(env.dir, "staging", id))
	env.start()
	if _, err := env.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatalf("delete after lost mounts: %v", err)
	}
}

func TestUnhealthyPool(t *testing.T) {
	testutilRoot(t)
	env := startDriver(t, testPool{name: "fast"}, testPool{name: "slow"})
	ctx := context.Background()
	v := env.create("on-fast", 16*mb, map[string]string{"pool": "fast"})
	// The fast pool's directory goes away.
	fast := env.pools[0].path
	if err := os.Rename(fast, fast+".gone"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Rename(fast+".gone", fast) })
	env.driver.pools.Refresh()

	_, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "x", CapacityRange: &csi.CapacityRange{RequiredBytes: 16 * mb},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}, Parameters: map[string]string{"pool": "fast"}})
	wantCode(t, err, codes.ResourceExhausted, "unhealthy")
	other := env.create("elsewhere", 16*mb, nil)
	if ids.PoolOfVolumeID(other.GetVolumeId()) != "slow" {
		t.Fatalf("volume placed on %s while fast is unhealthy", other.GetVolumeId())
	}
	h, err := env.ctrl.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: v.GetVolumeId()})
	if err != nil || len(h.GetVolumeHealth().GetHealthStatuses()) != 1 || h.GetVolumeHealth().GetHealthStatuses()[0].GetStatus() != csi.VolumeHealthErrorType_INACCESSIBLE {
		t.Fatalf("volume health: %v %v", h, err)
	}
	list, err := env.ctrl.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{})
	if err != nil || len(list.GetEntries()) != 1 {
		t.Fatalf("ListVolumeHealth: %v %v", list, err)
	}
	sh, err := env.node.NodeGetStorageHealth(ctx, &csi.NodeGetStorageHealthRequest{})
	if err != nil || len(sh.GetBackendHealth()) != 1 {
		t.Fatalf("storage health: %v %v", sh, err)
	}
	probe, err := env.ident.Probe(ctx, &csi.ProbeRequest{})
	if err != nil || !probe.GetReady().GetValue() {
		t.Fatalf("probe with one healthy pool: %v %v", probe, err)
	}
}

func TestEphemeralInlineVolume(t *testing.T) {
	testutilRoot(t)
	env := startDriver(t, testPool{name: "fast"})
	ctx := context.Background()
	target := filepath.Join(env.dir, "pods", "inline")
	req := &csi.NodePublishVolumeRequest{VolumeId: "csi-0123abcd", TargetPath: target, VolumeCapability: mountCap(""),
		VolumeContext: map[string]string{"csi.storage.k8s.io/ephemeral": "true", "size": "24Mi", "pool": "fast",
			"csi.storage.k8s.io/pod.name": "p"}}
	for i := 0; i < 2; i++ { // idempotent
		if _, err := env.node.NodePublishVolume(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(target, "scratch"), []byte("ok"), 0o644); err != nil {
		t.Fatal(err)
	}
	if total := statfsTotal(t, target); total > 24*mb {
		t.Fatalf("inline volume is %d bytes, want at most 24 MiB", total)
	}
	if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "csi-0123abcd", TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if len(env.driver.volumes.Store().ListVolumes()) != 0 {
		t.Fatal("inline volume not deleted on unpublish")
	}
	bad := &csi.NodePublishVolumeRequest{VolumeId: "csi-bad", TargetPath: target, VolumeCapability: mountCap(""),
		VolumeContext: map[string]string{"csi.storage.k8s.io/ephemeral": "true", "size": "lots"}}
	_, err := env.node.NodePublishVolume(ctx, bad)
	wantCode(t, err, codes.InvalidArgument, "size")
}

func syncFilesystem(path string) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	_ = unix.Syncfs(fd)
}
