package volume

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/ids"
	"github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/state"
)

// TestCreateVolumeRequests: the controller side's CreateVolume, without root — a repeated
// request returns the volume, a different one is AlreadyExists, and sources resolve to their
// pool and state (or to the codes external-provisioner acts on).
func TestCreateVolumeRequests(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, false)
	base := CreateRequest{Name: "pvc-1", Size: 16 << 20, RequiredBytes: 16 << 20, Access: state.Mount, FSType: "ext4",
		Parameters: map[string]string{"pool": "fast"}, Params: params.Volume{Pool: "fast"}, InTopology: true}
	v, err := e.s.CreateVolume(ctx, base)
	if err != nil || !v.Ready || v.Pool != "fast" {
		t.Fatalf("CreateVolume: %+v %v", v, err)
	}
	sn, err := e.s.CreateSnapshot(ctx, "snap-1", v.ID, true)
	if err != nil || sn.SourceVolumeID != v.ID || ids.NodeOfSnapshotID(sn.ID) != "node-1" {
		t.Fatalf("CreateSnapshot: %+v %v", sn, err)
	}

	with := func(f func(*CreateRequest)) CreateRequest {
		r := base
		f(&r)
		return r
	}
	for _, tc := range []struct {
		name string
		req  CreateRequest
		want codes.Code
	}{
		{"repeated request", base, codes.OK},
		{"failure case - same name, larger", with(func(r *CreateRequest) { r.RequiredBytes = 32 << 20 }), codes.AlreadyExists},
		{"failure case - same name, block", with(func(r *CreateRequest) { r.Access = state.Block }), codes.AlreadyExists},
		{"failure case - same name, other parameters", with(func(r *CreateRequest) { r.Parameters = nil }), codes.AlreadyExists},
		{"failure case - outside the topology", with(func(r *CreateRequest) { r.Name, r.InTopology = "pvc-2", false }), codes.ResourceExhausted},
		{"restore", with(func(r *CreateRequest) { r.Name, r.Source = "restored", &Source{Snapshot: true, ID: sn.ID} }), codes.OK},
		{"clone", with(func(r *CreateRequest) { r.Name, r.Source = "cloned", &Source{ID: v.ID} }), codes.OK},
		{"failure case - snapshot larger than the volume", with(func(r *CreateRequest) {
			r.Name, r.Size, r.Source = "small", 8<<20, &Source{Snapshot: true, ID: sn.ID}
		}), codes.OutOfRange},
		{"failure case - snapshot on another node", with(func(r *CreateRequest) {
			r.Name, r.Source = "elsewhere", &Source{Snapshot: true, ID: ids.NewSnapshotID("fast", "node-2")}
		}), codes.ResourceExhausted},
		{"failure case - unknown snapshot", with(func(r *CreateRequest) { r.Name, r.Source = "unknown", &Source{Snapshot: true, ID: "fast-snap-x"} }), codes.NotFound},
		{"failure case - unknown volume", with(func(r *CreateRequest) { r.Name, r.Source = "unknown", &Source{ID: ids.NewVolumeID("fast")} }), codes.NotFound},
		{"failure case - clone of a mount volume as block", with(func(r *CreateRequest) {
			r.Name, r.Access, r.Source = "block", state.Block, &Source{ID: v.ID}
		}), codes.InvalidArgument},
		{"failure case - source in another pool", with(func(r *CreateRequest) {
			r.Name, r.Params, r.Source = "slow", params.Volume{Pool: "slow"}, &Source{ID: v.ID}
		}), codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := e.s.CreateVolume(ctx, tc.req)
			wantCode(t, err, tc.want)
			if err != nil {
				return
			}
			if snap, vol := tc.req.Source.ids(); got.Name != tc.req.Name || got.SourceSnapshotID != snap || got.SourceVolumeID != vol || got.Pool != "fast" {
				t.Fatalf("created %+v", got)
			}
			// A snapshot is of a formatted filesystem; a clone is formatted when its source was.
			if tc.req.Source != nil && got.Formatted != tc.req.Source.Snapshot {
				t.Fatalf("restored or cloned volume's Formatted is %v: %+v", got.Formatted, got)
			}
		})
	}
	if n := len(e.s.ReadyVolumes()); n != 3 {
		t.Fatalf("%d ready volumes, want pvc-1, restored and cloned", n)
	}
}

// TestGroupSnapshotRecords: a group snapshot is its members; deleting a member alone is refused,
// deleting the group removes them all; a repeated request returns the group.
func TestGroupSnapshotRecords(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, false)
	a, b := e.volume(t, state.Volume{Name: "a"}), e.volume(t, state.Volume{Name: "b"})
	g, err := e.s.CreateGroupSnapshot(ctx, "grp", []string{a.ID, b.ID})
	if err != nil || !g.Ready || len(g.SnapshotIDs) != 2 {
		t.Fatalf("CreateGroupSnapshot: %+v %v", g, err)
	}
	again, err := e.s.CreateGroupSnapshot(ctx, "grp", []string{b.ID, a.ID})
	if err != nil || again.ID != g.ID {
		t.Fatalf("repeated CreateGroupSnapshot: %+v %v", again, err)
	}
	_, err = e.s.CreateGroupSnapshot(ctx, "grp", []string{a.ID})
	wantCode(t, err, codes.AlreadyExists)
	wantCode(t, e.s.DeleteSnapshot(g.SnapshotIDs[0]), codes.FailedPrecondition)
	_, err = e.s.ReadyGroupSnapshot(g.ID, g.SnapshotIDs[:1])
	wantCode(t, err, codes.InvalidArgument)
	if members, ok := e.s.GroupSnapshotMembers(g.ID); !ok || len(members) != 2 {
		t.Fatalf("members %v %v", members, ok)
	}
	if err := e.s.DeleteGroupSnapshot(g.ID, nil); err != nil {
		t.Fatal(err)
	}
	if n := len(e.s.ReadySnapshots("", "")); n != 0 {
		t.Fatalf("%d snapshots left after the group's delete", n)
	}
	_, err = e.s.ReadyGroupSnapshot(g.ID, nil)
	wantCode(t, err, codes.NotFound)
	if err := e.s.DeleteGroupSnapshot(g.ID, nil); err != nil {
		t.Fatalf("deleting a group already gone: %v", err)
	}
}
