package driver

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// TestDatasetRestoreAndClone (issue 24, item 8): a class with a dataset source restores
// snapshots and clones volumes again. The new volume holds the snapshot's or source volume's
// files, the user's changes included, and is never filled from the dataset: here the source is
// gone before the restore, so any staging would fail.
func TestDatasetRestoreAndClone(t *testing.T) {
	env, src := datasetEnv(t)
	ctx := context.Background()
	params := map[string]string{"source": "file://" + src + "/set", "pool": "fast"}
	vol := env.create("ds-orig", 64<<20, params)
	stage := func(v *csi.Volume) string {
		t.Helper()
		staging := filepath.Join(env.dir, "staging", v.VolumeId)
		if err := retryUnavailable(t, func() error {
			_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.VolumeId,
				StagingTargetPath: staging, VolumeCapability: mountCap(""), VolumeContext: v.VolumeContext})
			return err
		}); err != nil {
			t.Fatalf("NodeStageVolume %s: %v", v.VolumeId, err)
		}
		return staging
	}
	unstage := func(v *csi.Volume, staging string) {
		t.Helper()
		if _, err := env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.VolumeId, StagingTargetPath: staging}); err != nil {
			t.Fatal(err)
		}
	}
	staging := stage(vol)
	changed := map[string]string{"a.txt": "changed by the user", "d/b.txt": "beta", "mine.txt": "the user's own"}
	for k, v := range map[string]string{"a.txt": changed["a.txt"], "mine.txt": changed["mine.txt"]} {
		if err := os.WriteFile(filepath.Join(staging, k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	unstage(vol, staging)
	snap, err := env.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "ds-snap", SourceVolumeId: vol.VolumeId})
	if err != nil {
		t.Fatal(err)
	}
	// The dataset is gone from its source: a restore that staged it would fail.
	if err := os.RemoveAll(filepath.Join(src, "set")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		from *csi.VolumeContentSource
	}{
		{"restore a snapshot", &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.Snapshot.SnapshotId}}}},
		{"clone a volume", &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
			Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol.VolumeId}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "ds-" + tc.name,
				CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20}, VolumeCapabilities: []*csi.VolumeCapability{mountCap("")},
				Parameters: params, VolumeContentSource: tc.from})
			if err != nil {
				t.Fatalf("CreateVolume: %v", err)
			}
			staging := stage(resp.Volume)
			checkFiles(t, staging, changed)
			unstage(resp.Volume, staging)
		})
	}
}
