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

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/state"
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
	sn, err := d.volumes.CreateSnapshot(ctx, name, srcID, d.topologyAllows(req.GetAccessibilityRequirements()))
	if err != nil {
		return nil, err
	}
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
	id := req.GetSnapshotId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot ID is required")
	}
	if err := s.d.volumes.DeleteSnapshot(id); err != nil {
		return nil, err
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

func (s *controllerServer) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot ID is required")
	}
	sn, err := s.d.volumes.ReadySnapshot(id)
	if err != nil {
		return nil, err
	}
	return &csi.GetSnapshotResponse{Snapshot: s.d.csiSnapshot(sn)}, nil
}

func (s *controllerServer) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	list := s.d.volumes.ReadySnapshots(req.GetSnapshotId(), req.GetSourceVolumeId())
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
