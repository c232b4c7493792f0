package driver

import (
	"context"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// keyLocks serialises operations per volume (or snapshot, or name) without a global lock: a
// slow operation on one volume never blocks another. A second operation on a busy key fails
// at once with Aborted, which the CO retries with backoff.
type keyLocks struct {
	mu   sync.Mutex
	busy map[string]struct{}
}

func newKeyLocks() *keyLocks { return &keyLocks{busy: map[string]struct{}{}} }

// acquire locks every key or none, and returns the release function.
func (l *keyLocks) acquire(keys ...string) (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		if _, ok := l.busy[k]; ok {
			return nil, status.Errorf(codes.Aborted, "an operation on %s is already in progress", k)
		}
	}
	for _, k := range keys {
		l.busy[k] = struct{}{}
	}
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, k := range keys {
			delete(l.busy, k)
		}
	}, nil
}

func volumeKey(id string) string           { return "volume " + id }
func volumeNameKey(n string) string        { return "volume name " + n }
func snapshotKey(id string) string         { return "snapshot " + id }
func snapshotNameKey(n string) string      { return "snapshot name " + n }
func groupSnapshotKey(id string) string    { return "group snapshot " + id }
func groupSnapshotNameKey(n string) string { return "group snapshot name " + n }

// lockKeys is the one table of what each RPC locks; handlers take no locks themselves (the
// TopoLVM split). An RPC that reads a volume or snapshot to copy it locks that source too, so a
// snapshot, clone or restore sees the whole source or none of it, never one being deleted,
// expanded or staged. Read-only RPCs lock nothing.
func (d *Driver) lockKeys(req any) []string {
	switch r := req.(type) {
	case *csi.CreateVolumeRequest:
		keys := []string{volumeNameKey(r.GetName())}
		if id := r.GetVolumeContentSource().GetSnapshot().GetSnapshotId(); id != "" {
			keys = append(keys, snapshotKey(id))
		}
		if id := r.GetVolumeContentSource().GetVolume().GetVolumeId(); id != "" {
			keys = append(keys, volumeKey(id))
		}
		return keys
	case *csi.DeleteVolumeRequest:
		return []string{volumeKey(r.GetVolumeId())}
	case *csi.ControllerExpandVolumeRequest:
		return []string{volumeKey(r.GetVolumeId())}
	case *csi.ControllerModifyVolumeRequest:
		return []string{volumeKey(r.GetVolumeId())}
	case *csi.CreateSnapshotRequest:
		return []string{snapshotNameKey(r.GetName()), volumeKey(r.GetSourceVolumeId())}
	case *csi.DeleteSnapshotRequest:
		return []string{snapshotKey(r.GetSnapshotId())}
	case *csi.CreateVolumeGroupSnapshotRequest:
		keys := []string{groupSnapshotNameKey(r.GetName())}
		for _, id := range r.GetSourceVolumeIds() {
			keys = append(keys, volumeKey(id))
		}
		return keys
	case *csi.DeleteVolumeGroupSnapshotRequest:
		// The members go with the group: a restore from one of them must not overlap.
		members := r.GetSnapshotIds()
		if ids, ok := d.volumes.GroupSnapshotMembers(r.GetGroupSnapshotId()); ok {
			members = ids
		}
		keys := []string{groupSnapshotKey(r.GetGroupSnapshotId())}
		for _, id := range members {
			keys = append(keys, snapshotKey(id))
		}
		return keys
	case *csi.NodeStageVolumeRequest:
		return []string{volumeKey(r.GetVolumeId())}
	case *csi.NodeUnstageVolumeRequest:
		return []string{volumeKey(r.GetVolumeId())}
	case *csi.NodePublishVolumeRequest:
		return []string{volumeKey(r.GetVolumeId())}
	case *csi.NodeUnpublishVolumeRequest:
		return []string{volumeKey(r.GetVolumeId())}
	case *csi.NodeExpandVolumeRequest:
		return []string{volumeKey(r.GetVolumeId())}
	}
	return nil
}

// lockRequest is the interceptor that holds an RPC's lock keys (lockKeys) while it runs.
func (d *Driver) lockRequest(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	keys := d.lockKeys(req)
	if len(keys) == 0 {
		return handler(ctx, req)
	}
	release, err := d.locks.acquire(dedupe(keys)...)
	if err != nil {
		return nil, err
	}
	defer release()
	return handler(ctx, req)
}

// dedupe drops repeated keys (a group snapshot naming a volume twice) while keeping the order.
func dedupe(keys []string) []string {
	seen := make(map[string]bool, len(keys))
	out := keys[:0]
	for _, k := range keys {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}
