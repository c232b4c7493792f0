package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cistern-csi/cistern/pkg/state"
)

// groupControllerServer takes consistent snapshots of several volumes at once: every staged
// filesystem of the group is frozen before the first copy and thawed after the last.
type groupControllerServer struct {
	csi.UnimplementedGroupControllerServer
	d *Driver
}

func (s *groupControllerServer) GroupControllerGetCapabilities(context.Context, *csi.GroupControllerGetCapabilitiesRequest) (*csi.GroupControllerGetCapabilitiesResponse, error) {
	return &csi.GroupControllerGetCapabilitiesResponse{Capabilities: []*csi.GroupControllerServiceCapability{{
		Type: &csi.GroupControllerServiceCapability_Rpc{Rpc: &csi.GroupControllerServiceCapability_RPC{
			Type: csi.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT}},
	}}}, nil
}

func (s *groupControllerServer) CreateVolumeGroupSnapshot(ctx context.Context, req *csi.CreateVolumeGroupSnapshotRequest) (*csi.CreateVolumeGroupSnapshotResponse, error) {
	d := s.d
	name, ids := req.GetName(), req.GetSourceVolumeIds()
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "group snapshot name is required")
	}
	if len(ids) == 0 {
		return nil, status.Error(codes.InvalidArgument, "source volume IDs are required")
	}
	if err := checkSnapshotParameters(req.GetParameters()); err != nil {
		return nil, err
	}
	g, err := d.volumes.CreateGroupSnapshot(ctx, name, ids)
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeGroupSnapshotResponse{GroupSnapshot: d.csiGroupSnapshot(g)}, nil
}

func (d *Driver) csiGroupSnapshot(g state.GroupSnapshot) *csi.VolumeGroupSnapshot {
	out := &csi.VolumeGroupSnapshot{GroupSnapshotId: g.ID, CreationTime: timestamppb.New(g.CreatedAt), ReadyToUse: g.Ready}
	for _, sn := range d.volumes.Snapshots(g.SnapshotIDs) {
		out.Snapshots = append(out.Snapshots, d.csiSnapshot(sn))
	}
	return out
}

func (s *groupControllerServer) DeleteVolumeGroupSnapshot(ctx context.Context, req *csi.DeleteVolumeGroupSnapshotRequest) (*csi.DeleteVolumeGroupSnapshotResponse, error) {
	id := req.GetGroupSnapshotId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "group snapshot ID is required")
	}
	if err := s.d.volumes.DeleteGroupSnapshot(id, req.GetSnapshotIds()); err != nil {
		return nil, err
	}
	return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
}

func (s *groupControllerServer) GetVolumeGroupSnapshot(ctx context.Context, req *csi.GetVolumeGroupSnapshotRequest) (*csi.GetVolumeGroupSnapshotResponse, error) {
	id := req.GetGroupSnapshotId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "group snapshot ID is required")
	}
	g, err := s.d.volumes.ReadyGroupSnapshot(id, req.GetSnapshotIds())
	if err != nil {
		return nil, err
	}
	return &csi.GetVolumeGroupSnapshotResponse{GroupSnapshot: s.d.csiGroupSnapshot(g)}, nil
}
