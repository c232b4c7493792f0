package driver

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/state"
	"github.com/cistern-csi/cistern/pkg/volume"
)

// TestLockKeys: the table names every volume and snapshot an RPC reads or changes, sources
// included. It needs no root.
func TestLockKeys(t *testing.T) {
	store, err := state.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := store.PutGroupSnapshot(state.GroupSnapshot{ID: "g1", Name: "grp", SnapshotIDs: []string{"s1", "s2"}, Ready: true}); err != nil {
		t.Fatal(err)
	}
	d := &Driver{volumes: volume.New(volume.Config{Store: store})}
	for _, tc := range []struct {
		name string
		req  any
		want []string
	}{
		{"create empty volume", &csi.CreateVolumeRequest{Name: "pvc-1"}, []string{"volume name pvc-1"}},
		{"restore locks the snapshot", &csi.CreateVolumeRequest{Name: "pvc-1", VolumeContentSource: &csi.VolumeContentSource{
			Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "s1"}}}},
			[]string{"volume name pvc-1", "snapshot s1"}},
		{"clone locks the source volume", &csi.CreateVolumeRequest{Name: "pvc-1", VolumeContentSource: &csi.VolumeContentSource{
			Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "v1"}}}},
			[]string{"volume name pvc-1", "volume v1"}},
		{"snapshot locks its source volume", &csi.CreateSnapshotRequest{Name: "snap-1", SourceVolumeId: "v1"},
			[]string{"snapshot name snap-1", "volume v1"}},
		{"group snapshot locks every source once", &csi.CreateVolumeGroupSnapshotRequest{Name: "grp", SourceVolumeIds: []string{"v1", "v2", "v1"}},
			[]string{"group snapshot name grp", "volume v1", "volume v2"}},
		{"group delete locks the recorded members", &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: "g1"},
			[]string{"group snapshot g1", "snapshot s1", "snapshot s2"}},
		{"group delete of an unknown group locks the named members", &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: "g9", SnapshotIds: []string{"s9"}},
			[]string{"group snapshot g9", "snapshot s9"}},
		{"delete volume", &csi.DeleteVolumeRequest{VolumeId: "v1"}, []string{"volume v1"}},
		{"delete snapshot", &csi.DeleteSnapshotRequest{SnapshotId: "s1"}, []string{"snapshot s1"}},
		{"expand", &csi.ControllerExpandVolumeRequest{VolumeId: "v1"}, []string{"volume v1"}},
		{"modify", &csi.ControllerModifyVolumeRequest{VolumeId: "v1"}, []string{"volume v1"}},
		{"stage", &csi.NodeStageVolumeRequest{VolumeId: "v1"}, []string{"volume v1"}},
		{"unstage", &csi.NodeUnstageVolumeRequest{VolumeId: "v1"}, []string{"volume v1"}},
		{"publish", &csi.NodePublishVolumeRequest{VolumeId: "v1"}, []string{"volume v1"}},
		{"unpublish", &csi.NodeUnpublishVolumeRequest{VolumeId: "v1"}, []string{"volume v1"}},
		{"node expand", &csi.NodeExpandVolumeRequest{VolumeId: "v1"}, []string{"volume v1"}},
		{"read-only RPCs lock nothing", &csi.ListVolumesRequest{}, nil},
		{"stats lock nothing", &csi.NodeGetVolumeStatsRequest{VolumeId: "v1"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := dedupe(d.lockKeys(tc.req)); !slices.Equal(got, tc.want) {
				t.Fatalf("keys %q, want %q", got, tc.want)
			}
		})
	}
}

// pausingImages pauses one image operation: the test learns when it is under way and lets it
// finish. before pauses ahead of the real operation, otherwise after it.
type pausingImages struct {
	volume.Images
	mu      sync.Mutex
	op      string
	before  bool
	entered chan struct{}
	resume  chan struct{}
}

// hold arms a pause of the next call of op.
func (p *pausingImages) hold(op string, before bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.op, p.before = op, before
	p.entered, p.resume = make(chan struct{}), make(chan struct{})
}

func (p *pausingImages) pause(op string, real func() error) error {
	p.mu.Lock()
	armed := p.op == op
	before, entered, resume := p.before, p.entered, p.resume
	if armed {
		p.op = ""
	}
	p.mu.Unlock()
	if !armed {
		return real()
	}
	var err error
	if !before {
		err = real()
	}
	close(entered)
	<-resume
	if before {
		err = real()
	}
	return err
}

func (p *pausingImages) Remove(path string) error {
	return p.pause("Remove", func() error { return p.Images.Remove(path) })
}

func (p *pausingImages) CreateFrom(path, src string, size int64) error {
	return p.pause("CreateFrom", func() error { return p.Images.CreateFrom(path, src, size) })
}

// TestSnapshotOfVolumeBeingDeleted: CreateSnapshot and DeleteVolume of one volume are
// serialized. A snapshot asked for while the volume's image is already gone but its record not
// yet is refused with Aborted and then NotFound; a delete asked for while a snapshot copies the
// image waits (Aborted) until the snapshot holds the whole volume.
func TestSnapshotOfVolumeBeingDeleted(t *testing.T) {
	env := startDriver(t, testPool{name: "fast"})
	imgs := &pausingImages{}
	env.wrapImages = func(i volume.Images) volume.Images { imgs.Images = i; return imgs }
	env.restart()
	ctx := context.Background()
	snapshot := func(name, src string) (*csi.CreateSnapshotResponse, error) {
		return env.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: src})
	}
	deleteVolume := func(id string) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
			done <- err
		}()
		return done
	}

	t.Run("delete first", func(t *testing.T) {
		vol := env.create("doomed", 16*mb, nil)
		imgs.hold("Remove", false) // the image is gone, the record not yet
		done := deleteVolume(vol.GetVolumeId())
		<-imgs.entered
		_, err := snapshot("of-doomed", vol.GetVolumeId())
		wantCode(t, err, codes.Aborted, "in progress")
		close(imgs.resume)
		if err := <-done; err != nil {
			t.Fatalf("DeleteVolume: %v", err)
		}
		_, err = snapshot("of-doomed", vol.GetVolumeId())
		wantCode(t, err, codes.NotFound, "")
	})

	t.Run("snapshot first", func(t *testing.T) {
		vol := env.create("kept", 16*mb, nil)
		imgs.hold("CreateFrom", true)
		got := make(chan error, 1)
		var resp *csi.CreateSnapshotResponse
		go func() {
			var err error
			resp, err = snapshot("of-kept", vol.GetVolumeId())
			got <- err
		}()
		<-imgs.entered
		_, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.GetVolumeId()})
		wantCode(t, err, codes.Aborted, "in progress")
		close(imgs.resume)
		if err := <-got; err != nil {
			t.Fatalf("CreateSnapshot: %v", err)
		}
		sn := resp.GetSnapshot()
		if !sn.GetReadyToUse() || sn.GetSizeBytes() != vol.GetCapacityBytes() {
			t.Fatalf("snapshot %v of a %d-byte volume", sn, vol.GetCapacityBytes())
		}
		if err := <-deleteVolume(vol.GetVolumeId()); err != nil {
			t.Fatalf("DeleteVolume after the snapshot: %v", err)
		}
		// The snapshot outlives its volume and restores it whole.
		restored, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "restored", CapacityRange: &csi.CapacityRange{RequiredBytes: 16 * mb},
			VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}, VolumeContentSource: &csi.VolumeContentSource{
				Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: sn.GetSnapshotId()}}}})
		if err != nil || restored.GetVolume().GetCapacityBytes() != vol.GetCapacityBytes() {
			t.Fatalf("restore: %v %v", restored, err)
		}
	})
}
