package driver

import (
	"context"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/image"
	"github.com/cistern-csi/cistern/pkg/pool"
	"github.com/cistern-csi/cistern/pkg/state"
)

func wrapInt64(v int64) *wrapperspb.Int64Value { return wrapperspb.Int64(v) }

// CreateSnapshot copies the volume's image inside its pool: a reflink where the filesystem
// shares extents, a sparse copy otherwise. A staged volume's filesystem is synced first, so the
// snapshot is crash-consistent.
func (s *controllerServer) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	d := s.d
	name, srcID := req.GetName(), req.GetSourceVolumeId()
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot name is required")
	}
	if srcID == "" {
		return nil, status.Error(codes.InvalidArgument, "source volume ID is required")
	}
	release, err := d.locks.acquire(snapshotNameKey(name))
	if err != nil {
		return nil, err
	}
	defer release()
	if sn, ok := d.store.GetSnapshotByName(name); ok && sn.Ready {
		if sn.SourceVolumeID != srcID {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %q exists for volume %s", name, sn.SourceVolumeID)
		}
		return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(sn)}, nil
	}
	v, ok := d.store.GetVolume(srcID)
	if !ok || !v.Ready {
		return nil, status.Errorf(codes.NotFound, "source volume %s does not exist", srcID)
	}
	p, ok := d.pools.Get(v.Pool)
	if !ok {
		return nil, status.Errorf(codes.FailedPrecondition, "pool %q is not configured on node %s", v.Pool, d.cfg.NodeID)
	}
	if v.StagingPath != "" && v.AccessType == state.Mount {
		syncFilesystem(v.StagingPath)
	}
	sn := state.Snapshot{
		ID:             newSnapshotID(v.Pool),
		Name:           name,
		SourceVolumeID: srcID,
		Pool:           v.Pool,
		SizeBytes:      v.CapacityBytes,
		CreatedAt:      time.Now().UTC(),
	}
	if err := d.store.PutSnapshot(sn); err != nil {
		return nil, internal("saving snapshot state", err)
	}
	img := image.SnapshotPath(p.Path, pool.MetaDir, sn.ID)
	if err := image.CreateFrom(img, image.VolumePath(p.Path, pool.MetaDir, v.ID), 0); err != nil {
		_ = image.Remove(img)
		_ = d.store.DeleteSnapshot(sn.ID)
		if strings.Contains(err.Error(), "no space left") {
			return nil, status.Errorf(codes.ResourceExhausted, "pool %q: %v", v.Pool, err)
		}
		return nil, internal("copying volume image", err)
	}
	sn.Ready = true
	if err := d.store.PutSnapshot(sn); err != nil {
		_ = image.Remove(img)
		_ = d.store.DeleteSnapshot(sn.ID)
		return nil, internal("saving snapshot state", err)
	}
	d.pools.Refresh()
	klog.FromContext(ctx).V(4).Info("Created snapshot", "snapshotID", sn.ID, "volumeID", srcID)
	return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(sn)}, nil
}

func syncFilesystem(path string) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	_ = unix.Syncfs(fd)
}

func csiSnapshot(sn state.Snapshot) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:     sn.ID,
		SourceVolumeId: sn.SourceVolumeID,
		SizeBytes:      sn.SizeBytes,
		CreationTime:   timestamppb.New(sn.CreatedAt),
		ReadyToUse:     sn.Ready,
	}
}

func (s *controllerServer) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	d := s.d
	id := req.GetSnapshotId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot ID is required")
	}
	release, err := d.locks.acquire(snapshotKey(id))
	if err != nil {
		return nil, err
	}
	defer release()
	sn, ok := d.store.GetSnapshot(id)
	if !ok {
		return &csi.DeleteSnapshotResponse{}, nil
	}
	if p, ok := d.pools.Get(sn.Pool); ok {
		if err := image.Remove(image.SnapshotPath(p.Path, pool.MetaDir, id)); err != nil {
			return nil, internal("removing snapshot image", err)
		}
	}
	if err := d.store.DeleteSnapshot(id); err != nil {
		return nil, internal("removing snapshot state", err)
	}
	d.pools.Refresh()
	return &csi.DeleteSnapshotResponse{}, nil
}

func (s *controllerServer) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	var list []state.Snapshot
	for _, sn := range s.d.store.ListSnapshots() {
		if !sn.Ready {
			continue
		}
		if id := req.GetSnapshotId(); id != "" && sn.ID != id {
			continue
		}
		if src := req.GetSourceVolumeId(); src != "" && sn.SourceVolumeID != src {
			continue
		}
		list = append(list, sn)
	}
	snaps, next, err := page(list, func(sn state.Snapshot) string { return sn.ID }, req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	resp := &csi.ListSnapshotsResponse{NextToken: next}
	for _, sn := range snaps {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: csiSnapshot(sn)})
	}
	return resp, nil
}
