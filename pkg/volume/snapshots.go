package volume

import (
	"context"
	"slices"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/ids"
	"github.com/cistern-csi/cistern/pkg/state"
)

// The controller's snapshot and group-snapshot records: what CreateSnapshot, DeleteSnapshot,
// the group RPCs and their reads see. The images are copied by Snapshot (controller.go).

// CreateSnapshot snapshots volume srcID as name, or returns the ready snapshot of that name when
// it is of srcID (AlreadyExists otherwise). A staged filesystem is frozen during the copy, so
// the snapshot is consistent. inTopology says the request's accessibility requirements admit
// this node: snapshots stay on their volume's node.
func (s *Service) CreateSnapshot(ctx context.Context, name, srcID string, inTopology bool) (state.Snapshot, error) {
	if sn, ok := s.store.GetSnapshotByName(name); ok && sn.Ready {
		if sn.SourceVolumeID != srcID {
			return state.Snapshot{}, status.Errorf(codes.AlreadyExists, "snapshot %q exists for volume %s", name, sn.SourceVolumeID)
		}
		return sn, nil
	}
	v, ok := s.store.GetVolume(srcID)
	if !ok || !v.Ready {
		return state.Snapshot{}, status.Errorf(codes.NotFound, "source volume %s does not exist", srcID)
	}
	if !inTopology {
		return state.Snapshot{}, status.Errorf(codes.ResourceExhausted, "snapshots of volume %s stay on node %s, outside the requested topology", srcID, s.nodeID)
	}
	thaw := Freeze(ctx, v)
	sn, err := s.Snapshot(v, name, "")
	thaw()
	if err != nil {
		return state.Snapshot{}, err
	}
	klog.FromContext(ctx).V(4).Info("Created snapshot", "snapshotID", sn.ID, "volumeID", srcID)
	return sn, nil
}

// DeleteSnapshot removes a snapshot's image and record; one already gone is no error. A member
// of a group snapshot goes only with its group (FailedPrecondition).
func (s *Service) DeleteSnapshot(id string) error {
	sn, ok := s.store.GetSnapshot(id)
	if !ok {
		return nil
	}
	if sn.GroupSnapshotID != "" {
		return status.Errorf(codes.FailedPrecondition, "snapshot %s belongs to group snapshot %s; delete the group", id, sn.GroupSnapshotID)
	}
	return s.deleteSnapshot(sn)
}

// ReadySnapshot returns a ready snapshot, or NotFound.
func (s *Service) ReadySnapshot(id string) (state.Snapshot, error) {
	sn, ok := s.store.GetSnapshot(id)
	if !ok || !sn.Ready {
		return state.Snapshot{}, status.Errorf(codes.NotFound, "snapshot %s does not exist", id)
	}
	return sn, nil
}

// ReadySnapshots lists the ready snapshots, by ID; snapshotID and sourceVolumeID, when not
// empty, filter them.
func (s *Service) ReadySnapshots(snapshotID, sourceVolumeID string) []state.Snapshot {
	var list []state.Snapshot
	for _, sn := range s.store.ListSnapshots() {
		if !sn.Ready || snapshotID != "" && sn.ID != snapshotID || sourceVolumeID != "" && sn.SourceVolumeID != sourceVolumeID {
			continue
		}
		list = append(list, sn)
	}
	return list
}

// Snapshots returns the snapshots of ids that exist, in order: a group's members.
func (s *Service) Snapshots(snapshotIDs []string) []state.Snapshot {
	var out []state.Snapshot
	for _, id := range snapshotIDs {
		if sn, ok := s.store.GetSnapshot(id); ok {
			out = append(out, sn)
		}
	}
	return out
}

func newGroupSnapshotID() string { return "group-" + ids.RandomHex() }

// CreateGroupSnapshot snapshots volumeIDs together as name, or returns the ready group of that
// name when it is of the same volumes (AlreadyExists otherwise). Every staged filesystem of the
// group is frozen before the first copy and thawed after the last, so the group is consistent
// across its volumes; a failure removes every member taken.
func (s *Service) CreateGroupSnapshot(ctx context.Context, name string, volumeIDs []string) (state.GroupSnapshot, error) {
	if g, ok := s.store.GetGroupSnapshotByName(name); ok && g.Ready {
		if !s.sameSources(g, volumeIDs) {
			return state.GroupSnapshot{}, status.Errorf(codes.AlreadyExists, "group snapshot %q exists for other volumes", name)
		}
		return g, nil
	}
	vols := make([]state.Volume, 0, len(volumeIDs))
	for _, id := range volumeIDs {
		v, ok := s.store.GetVolume(id)
		if !ok || !v.Ready {
			return state.GroupSnapshot{}, status.Errorf(codes.NotFound, "source volume %s does not exist", id)
		}
		vols = append(vols, v)
	}
	g := state.GroupSnapshot{ID: newGroupSnapshotID(), Name: name, CreatedAt: time.Now().UTC()}
	if err := s.store.PutGroupSnapshot(g); err != nil {
		return state.GroupSnapshot{}, Internal("saving group snapshot state", err)
	}
	var thaws []func()
	for _, v := range vols {
		thaws = append(thaws, Freeze(ctx, v))
	}
	taken, err := s.snapshotAll(g, vols)
	for _, t := range thaws {
		t()
	}
	if err != nil {
		for _, done := range taken {
			_ = s.deleteSnapshot(done)
		}
		_ = s.store.DeleteGroupSnapshot(g.ID)
		return state.GroupSnapshot{}, err
	}
	for _, sn := range taken {
		g.SnapshotIDs = append(g.SnapshotIDs, sn.ID)
	}
	g.Ready = true
	if err := s.store.PutGroupSnapshot(g); err != nil {
		return state.GroupSnapshot{}, Internal("saving group snapshot state", err)
	}
	klog.FromContext(ctx).V(4).Info("Created group snapshot", "groupSnapshotID", g.ID, "volumes", volumeIDs)
	return g, nil
}

// snapshotAll copies each volume into a member snapshot of g; on an error it returns the
// members taken so far with it.
func (s *Service) snapshotAll(g state.GroupSnapshot, vols []state.Volume) ([]state.Snapshot, error) {
	var taken []state.Snapshot
	for _, v := range vols {
		sn, err := s.Snapshot(v, g.Name+"/"+v.ID, g.ID)
		if err != nil {
			return taken, err
		}
		taken = append(taken, sn)
	}
	return taken, nil
}

func (s *Service) sameSources(g state.GroupSnapshot, volumeIDs []string) bool {
	var have []string
	for _, sn := range s.Snapshots(g.SnapshotIDs) {
		have = append(have, sn.SourceVolumeID)
	}
	want := append([]string(nil), volumeIDs...)
	sort.Strings(have)
	sort.Strings(want)
	return slices.Equal(have, want)
}

// GroupSnapshotMembers returns the member snapshot IDs of a group snapshot, ready or not.
func (s *Service) GroupSnapshotMembers(id string) ([]string, bool) {
	g, ok := s.store.GetGroupSnapshot(id)
	return g.SnapshotIDs, ok
}

// ReadyGroupSnapshot returns a ready group snapshot (NotFound otherwise) whose members are
// members, when members is not empty (InvalidArgument otherwise).
func (s *Service) ReadyGroupSnapshot(id string, members []string) (state.GroupSnapshot, error) {
	g, ok := s.store.GetGroupSnapshot(id)
	if !ok || !g.Ready {
		return state.GroupSnapshot{}, status.Errorf(codes.NotFound, "group snapshot %s does not exist", id)
	}
	if err := checkMembers(g, members); err != nil {
		return state.GroupSnapshot{}, err
	}
	return g, nil
}

// DeleteGroupSnapshot removes a group snapshot and its members; one already gone is no error.
// members, when not empty, must be the group's (InvalidArgument otherwise).
func (s *Service) DeleteGroupSnapshot(id string, members []string) error {
	g, ok := s.store.GetGroupSnapshot(id)
	if !ok {
		return nil
	}
	if err := checkMembers(g, members); err != nil {
		return err
	}
	for _, sn := range s.Snapshots(g.SnapshotIDs) {
		if err := s.deleteSnapshot(sn); err != nil {
			return err
		}
	}
	if err := s.store.DeleteGroupSnapshot(id); err != nil {
		return Internal("removing group snapshot state", err)
	}
	return nil
}

// checkMembers verifies that the snapshot IDs a CO names are exactly the group's.
func checkMembers(g state.GroupSnapshot, named []string) error {
	if len(named) == 0 {
		return nil
	}
	want := append([]string(nil), named...)
	have := append([]string(nil), g.SnapshotIDs...)
	sort.Strings(want)
	sort.Strings(have)
	if !slices.Equal(have, want) {
		return status.Errorf(codes.InvalidArgument, "snapshot IDs %v are not the members of group snapshot %s", named, g.ID)
	}
	return nil
}
