package driver

import (
	"context"
	"slices"
	"sort"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/state"
	"github.com/cistern-csi/cistern/pkg/volume"
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

func newGroupSnapshotID() string { return "group-" + volume.RandomHex() }

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
	if g, ok := d.store.GetGroupSnapshotByName(name); ok && g.Ready {
		if !sameSources(d, g, ids) {
			return nil, status.Errorf(codes.AlreadyExists, "group snapshot %q exists for other volumes", name)
		}
		return &csi.CreateVolumeGroupSnapshotResponse{GroupSnapshot: d.csiGroupSnapshot(g)}, nil
	}
	vols := make([]state.Volume, 0, len(ids))
	for _, id := range ids {
		v, ok := d.store.GetVolume(id)
		if !ok || !v.Ready {
			return nil, status.Errorf(codes.NotFound, "source volume %s does not exist", id)
		}
		vols = append(vols, v)
	}
	g := state.GroupSnapshot{ID: newGroupSnapshotID(), Name: name, CreatedAt: time.Now().UTC()}
	if err := d.store.PutGroupSnapshot(g); err != nil {
		return nil, volume.Internal("saving group snapshot state", err)
	}
	var thaws []func()
	for _, v := range vols {
		thaws = append(thaws, volume.Freeze(ctx, v))
	}
	var taken []state.Snapshot
	for _, v := range vols {
		sn, err := d.volumes.Snapshot(v, g.Name+"/"+v.ID, g.ID)
		if err != nil {
			for _, t := range thaws {
				t()
			}
			for _, done := range taken {
				_ = d.volumes.DeleteSnapshot(done)
			}
			_ = d.store.DeleteGroupSnapshot(g.ID)
			return nil, err
		}
		taken = append(taken, sn)
		g.SnapshotIDs = append(g.SnapshotIDs, sn.ID)
	}
	for _, t := range thaws {
		t()
	}
	g.Ready = true
	if err := d.store.PutGroupSnapshot(g); err != nil {
		return nil, volume.Internal("saving group snapshot state", err)
	}
	klog.FromContext(ctx).V(4).Info("Created group snapshot", "groupSnapshotID", g.ID, "volumes", ids)
	return &csi.CreateVolumeGroupSnapshotResponse{GroupSnapshot: d.csiGroupSnapshot(g)}, nil
}

func sameSources(d *Driver, g state.GroupSnapshot, ids []string) bool {
	var have []string
	for _, sid := range g.SnapshotIDs {
		if sn, ok := d.store.GetSnapshot(sid); ok {
			have = append(have, sn.SourceVolumeID)
		}
	}
	want := append([]string(nil), ids...)
	sort.Strings(have)
	sort.Strings(want)
	return slices.Equal(have, want)
}

func (d *Driver) csiGroupSnapshot(g state.GroupSnapshot) *csi.VolumeGroupSnapshot {
	out := &csi.VolumeGroupSnapshot{GroupSnapshotId: g.ID, CreationTime: timestamppb.New(g.CreatedAt), ReadyToUse: g.Ready}
	for _, id := range g.SnapshotIDs {
		if sn, ok := d.store.GetSnapshot(id); ok {
			out.Snapshots = append(out.Snapshots, d.csiSnapshot(sn))
		}
	}
	return out
}

// checkMembers verifies that the snapshot IDs a CO names are exactly the group's.
func checkMembers(g state.GroupSnapshot, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	want := append([]string(nil), ids...)
	have := append([]string(nil), g.SnapshotIDs...)
	sort.Strings(want)
	sort.Strings(have)
	if !slices.Equal(have, want) {
		return status.Errorf(codes.InvalidArgument, "snapshot IDs %v are not the members of group snapshot %s", ids, g.ID)
	}
	return nil
}

func (s *groupControllerServer) DeleteVolumeGroupSnapshot(ctx context.Context, req *csi.DeleteVolumeGroupSnapshotRequest) (*csi.DeleteVolumeGroupSnapshotResponse, error) {
	d := s.d
	id := req.GetGroupSnapshotId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "group snapshot ID is required")
	}
	g, ok := d.store.GetGroupSnapshot(id)
	if !ok {
		return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
	}
	if err := checkMembers(g, req.GetSnapshotIds()); err != nil {
		return nil, err
	}
	for _, sid := range g.SnapshotIDs {
		if sn, ok := d.store.GetSnapshot(sid); ok {
			if err := d.volumes.DeleteSnapshot(sn); err != nil {
				return nil, err
			}
		}
	}
	if err := d.store.DeleteGroupSnapshot(id); err != nil {
		return nil, volume.Internal("removing group snapshot state", err)
	}
	return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
}

func (s *groupControllerServer) GetVolumeGroupSnapshot(ctx context.Context, req *csi.GetVolumeGroupSnapshotRequest) (*csi.GetVolumeGroupSnapshotResponse, error) {
	id := req.GetGroupSnapshotId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "group snapshot ID is required")
	}
	g, ok := s.d.store.GetGroupSnapshot(id)
	if !ok || !g.Ready {
		return nil, status.Errorf(codes.NotFound, "group snapshot %s does not exist", id)
	}
	if err := checkMembers(g, req.GetSnapshotIds()); err != nil {
		return nil, err
	}
	return &csi.GetVolumeGroupSnapshotResponse{GroupSnapshot: s.d.csiGroupSnapshot(g)}, nil
}
