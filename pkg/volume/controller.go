package volume

import (
	"context"
	"errors"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/ids"
	"github.com/cistern-csi/cistern/pkg/image"
	"github.com/cistern-csi/cistern/pkg/pool"
	"github.com/cistern-csi/cistern/pkg/state"
)

// The controller's side of image volumes: create, copy, grow and snapshot images. Every change
// writes its record first (not ready) and marks it ready last, so a crash in between is cleaned
// up at the next start; a failure removes what it made.

// Filesystem freeze ioctls (linux/fs.h: _IOWR('X', 119, int) and _IOWR('X', 120, int)).
const (
	ioctlFIFREEZE = 0xC0045877
	ioctlFITHAW   = 0xC0045878
)

// Create makes a new volume's image in the chosen pool, empty or copied from source (an image
// path: a snapshot's or another volume's), and records v, with its ID, as ready.
func (s *Service) Create(v state.Volume, chosen pool.Status, source string) (state.Volume, error) {
	v.Pool, v.ID = chosen.Name, ids.NewVolumeID(chosen.Name)
	if err := s.store.PutVolume(v); err != nil {
		return state.Volume{}, Internal("saving volume state", err)
	}
	img := image.VolumePath(chosen.Path, pool.MetaDir, v.ID)
	if err := s.shareLayer(v.Pool, v.DatasetLayer, v.SourceSnapshotID+v.SourceVolumeID, v.ID); err != nil {
		_ = s.store.DeleteVolume(v.ID)
		return state.Volume{}, err
	}
	var err error
	if source != "" {
		err = s.images.CreateFrom(img, source, v.CapacityBytes)
	} else {
		err = s.images.Create(img, v.CapacityBytes)
	}
	if err != nil {
		_ = s.images.Remove(img)
		_ = s.releaseLayer(v.Pool, v.DatasetLayer, v.ID)
		_ = s.store.DeleteVolume(v.ID)
		if !errors.Is(err, unix.ENOSPC) {
			s.pools.RecordError(chosen.Name, "creating volume image: "+err.Error())
		}
		return state.Volume{}, s.ImageError("creating volume image", chosen.Name, err)
	}
	v.Ready = true
	if err := s.store.PutVolume(v); err != nil {
		_ = s.images.Remove(img)
		_ = s.releaseLayer(v.Pool, v.DatasetLayer, v.ID)
		_ = s.store.DeleteVolume(v.ID)
		return state.Volume{}, Internal("saving volume state", err)
	}
	s.pools.UpdateCapacity(v.Pool)
	return v, nil
}

// Grow grows a volume's image to size within its pool's room; the filesystem grows on the node.
func (s *Service) Grow(v state.Volume, size int64) (state.Volume, error) {
	p, ok := s.pools.Get(v.Pool)
	if !ok {
		return state.Volume{}, status.Errorf(codes.FailedPrecondition, "pool %q is not configured on node %s", v.Pool, s.nodeID)
	}
	if grow := size - v.CapacityBytes; grow > pool.MaxVolumeBytes(p) {
		return state.Volume{}, status.Errorf(codes.ResourceExhausted, "pool %q has %d bytes free, not enough to grow volume %s by %d bytes", v.Pool, pool.MaxVolumeBytes(p), v.ID, grow)
	}
	if err := s.images.Grow(image.VolumePath(p.Path, pool.MetaDir, v.ID), size); err != nil {
		return state.Volume{}, s.ImageError("growing volume image", v.Pool, err)
	}
	v.CapacityBytes, v.NeedsGrow = size, true
	if err := s.store.PutVolume(v); err != nil {
		return state.Volume{}, Internal("saving volume state", err)
	}
	s.pools.UpdateCapacity(v.Pool)
	return v, nil
}

// ImageProblem says why a volume's image cannot be used: its pool gone or unhealthy, or the
// image missing (dataLoss); "" when it can.
func (s *Service) ImageProblem(v state.Volume) (reason, message string, dataLoss bool) {
	p, ok := s.pools.Get(v.Pool)
	if !ok {
		return "PoolNotConfigured", "pool " + v.Pool + " is not configured on node " + s.nodeID, false
	}
	if !p.Healthy {
		return "PoolUnhealthy", "pool " + v.Pool + " is unhealthy: " + p.Message, false
	}
	if _, err := s.images.Size(image.VolumePath(p.Path, pool.MetaDir, v.ID)); err != nil {
		return "ImageMissing", "volume image is missing: " + err.Error(), true
	}
	return "", "", false
}

// SnapshotPath returns the image path of a snapshot.
func (s *Service) SnapshotPath(sn state.Snapshot) (string, error) {
	p, err := s.PoolPath(sn.Pool)
	if err != nil {
		return "", err
	}
	return image.SnapshotPath(p, pool.MetaDir, sn.ID), nil
}

// Snapshot copies a volume's image inside its pool (a reflink where the filesystem shares
// extents, a sparse copy otherwise) into a new snapshot record.
func (s *Service) Snapshot(v state.Volume, name, groupID string) (state.Snapshot, error) {
	p, ok := s.pools.Get(v.Pool)
	if !ok {
		return state.Snapshot{}, status.Errorf(codes.FailedPrecondition, "pool %q is not configured on node %s", v.Pool, s.nodeID)
	}
	if err := s.settledLayer(&v); err != nil {
		return state.Snapshot{}, err
	}
	sn := state.Snapshot{
		ID:              ids.NewSnapshotID(v.Pool, s.nodeID),
		Name:            name,
		SourceVolumeID:  v.ID,
		Pool:            v.Pool,
		SizeBytes:       v.CapacityBytes,
		CreatedAt:       time.Now().UTC(),
		GroupSnapshotID: groupID,
		DatasetLayer:    v.DatasetLayer,
	}
	if err := s.store.PutSnapshot(sn); err != nil {
		return state.Snapshot{}, Internal("saving snapshot state", err)
	}
	if err := s.shareLayer(v.Pool, v.DatasetLayer, v.ID, sn.ID); err != nil {
		_ = s.store.DeleteSnapshot(sn.ID)
		return state.Snapshot{}, err
	}
	img := image.SnapshotPath(p.Path, pool.MetaDir, sn.ID)
	if err := s.images.CreateFrom(img, image.VolumePath(p.Path, pool.MetaDir, v.ID), 0); err != nil {
		_ = s.images.Remove(img)
		_ = s.releaseLayer(sn.Pool, sn.DatasetLayer, sn.ID)
		_ = s.store.DeleteSnapshot(sn.ID)
		return state.Snapshot{}, s.ImageError("copying volume image", v.Pool, err)
	}
	sn.Ready = true
	if err := s.store.PutSnapshot(sn); err != nil {
		_ = s.images.Remove(img)
		_ = s.releaseLayer(sn.Pool, sn.DatasetLayer, sn.ID)
		_ = s.store.DeleteSnapshot(sn.ID)
		return state.Snapshot{}, Internal("saving snapshot state", err)
	}
	s.pools.UpdateCapacity(sn.Pool)
	return sn, nil
}

// deleteSnapshot removes a snapshot's image and record.
func (s *Service) deleteSnapshot(sn state.Snapshot) error {
	if p, ok := s.pools.Get(sn.Pool); ok {
		if err := s.images.Remove(image.SnapshotPath(p.Path, pool.MetaDir, sn.ID)); err != nil {
			return Internal("removing snapshot image", err)
		}
	}
	if err := s.releaseLayer(sn.Pool, sn.DatasetLayer, sn.ID); err != nil {
		return Internal("releasing the snapshot's dataset layer", err)
	}
	if err := s.store.DeleteSnapshot(sn.ID); err != nil {
		return Internal("removing snapshot state", err)
	}
	s.pools.UpdateCapacity(sn.Pool)
	return nil
}

// Freeze flushes and freezes a staged mount volume's filesystem so its image is consistent
// while it is copied; the returned function thaws it. Volumes not staged here need nothing.
func Freeze(ctx context.Context, v state.Volume) func() {
	if v.StagingPath == "" || v.AccessType != state.Mount {
		return func() {}
	}
	fd, err := unix.Open(v.StagingPath, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return func() {}
	}
	if err := unix.IoctlSetInt(fd, ioctlFIFREEZE, 0); err != nil {
		// Frozen already, or unsupported: a flush still gives a crash-consistent copy.
		klog.FromContext(ctx).V(2).Info("Cannot freeze filesystem; syncing instead", "path", v.StagingPath, "err", err)
		_ = unix.Syncfs(fd)
		unix.Close(fd)
		return func() {}
	}
	return func() {
		_ = unix.IoctlSetInt(fd, ioctlFITHAW, 0)
		unix.Close(fd)
	}
}

// shareLayer gives holder (a snapshot, or a volume restored or cloned) a reference on the
// cached dataset version that from, its source, is layered on: the source's image holds only
// what its pods changed, so the copy needs the same lower layer. A source that is not layered
// (layer empty) needs nothing.
func (s *Service) shareLayer(poolName, layer, from, holder string) error {
	if layer == "" {
		return nil
	}
	if _, err := s.datasets.ShareLayer(poolName, layer, from, holder); err != nil {
		return status.Errorf(datasource.Code(err), "sharing the dataset layer of %s: %v", from, err)
	}
	return nil
}
