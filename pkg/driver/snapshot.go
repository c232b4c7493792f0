package driver

import (
	"context"
	"sort"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/state"
	"github.com/cistern-csi/cistern/pkg/volume"
)

func wrapInt64(v int64) *wrapperspb.Int64Value { return wrapperspb.Int64(v) }

// checkSnapshotParameters accepts only the keys external-snapshotter adds.
func checkSnapshotParameters(params map[string]string) error {
	keys := make([]string, 0, len(params))
	for k := range params {
		if !strings.HasPrefix(k, consts.ReservedParamPrefix) {
			keys = append(keys, k)
		}
	}
	if len(keys) > 0 {
		sort.Strings(keys)
		return status.Errorf(codes.InvalidArgument, "unknown snapshot parameter %q", keys[0])
	}
	return nil
}

// CreateSnapshot copies the volume's image inside its pool: a reflink where the filesystem
// shares extents, a sparse copy otherwise. A staged filesystem is frozen during the copy, so
// the snapshot is consistent.
func (s *controllerServer) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	d := s.d
	name, srcID := req.GetName(), req.GetSourceVolumeId()
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot name is required")
	}
	if srcID == "" {
		return nil, status.Error(codes.InvalidArgument, "source volume ID is required")
	}
	if err := checkSnapshotParameters(req.GetParameters()); err != nil {
		return nil, err
	}
	if sn, ok := d.store.GetSnapshotByName(name); ok && sn.Ready {
		if sn.SourceVolumeID != srcID {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %q exists for volume %s", name, sn.SourceVolumeID)
		}
		return &csi.CreateSnapshotResponse{Snapshot: d.csiSnapshot(sn)}, nil
	}
	v, ok := d.store.GetVolume(srcID)
	if !ok || !v.Ready {
		return nil, status.Errorf(codes.NotFound, "source volume %s does not exist", srcID)
	}
	if !d.topologyAllows(req.GetAccessibilityRequirements()) {
		return nil, status.Errorf(codes.ResourceExhausted, "snapshots of volume %s stay on node %s, outside the requested topology", srcID, d.cfg.NodeID)
	}
	thaw := volume.Freeze(ctx, v)
	sn, err := d.volumes.Snapshot(v, name, "")
	thaw()
	if err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(4).Info("Created snapshot", "snapshotID", sn.ID, "volumeID", srcID)
	return &csi.CreateSnapshotResponse{Snapshot: d.csiSnapshot(sn)}, nil
}

// csiSnapshot describes a snapshot. Its accessible_topology (alpha) is left out: a snapshot is
// always on its volume's node, and csi-test v5.6.0 compares the field with reflect-based
// equality that fails on protobuf size caches.
func (d *Driver) csiSnapshot(sn state.Snapshot) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:      sn.ID,
		SourceVolumeId:  sn.SourceVolumeID,
		SizeBytes:       sn.SizeBytes,
		CreationTime:    timestamppb.New(sn.CreatedAt),
		ReadyToUse:      sn.Ready,
		GroupSnapshotId: sn.GroupSnapshotID,
	}
}

func (s *controllerServer) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	d := s.d
	id := req.GetSnapshotId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot ID is required")
	}
	sn, ok := d.store.GetSnapshot(id)
	if !ok {
		return &csi.DeleteSnapshotResponse{}, nil
	}
	if sn.GroupSnapshotID != "" {
		return nil, status.Errorf(codes.FailedPrecondition, "snapshot %s belongs to group snapshot %s; delete the group", id, sn.GroupSnapshotID)
	}
	if err := d.volumes.DeleteSnapshot(sn); err != nil {
		return nil, err
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

func (s *controllerServer) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot ID is required")
	}
	sn, ok := s.d.store.GetSnapshot(id)
	if !ok || !sn.Ready {
		return nil, status.Errorf(codes.NotFound, "snapshot %s does not exist", id)
	}
	return &csi.GetSnapshotResponse{Snapshot: s.d.csiSnapshot(sn)}, nil
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
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: s.d.csiSnapshot(sn)})
	}
	return resp, nil
}
