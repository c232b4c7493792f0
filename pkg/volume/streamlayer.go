package volume

// A writable dataset volume with dataMode streaming (docs/datasets.md, "Writable volumes on a
// streaming tree") is a layered volume (layer.go) whose lower layer is its dataset's streaming
// tree (stream.go) instead of the cached tree: it is published as soon as the dataset is listed
// and the caller proved it reads it, as a read-only streaming volume is. The tree is a
// treeVolume of its own, recorded with LayerOf naming the volume, and mounted beside the
// volume's path (lowerPath), in the same kubelet directory, so that it outlives a restart of the
// plugin as the overlay does and the FUSE keeper's takeover serves it again. The volume takes
// its reference on the cached version (the layered volumes' guarantee of the same bytes for
// its whole life, and what the write-back reads) once that version is staged, at its next
// let-go or staging (settleStream); until then the streaming tree references (and holds) its version.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/state"
)

// lowerID is the ID of the streaming tree under writable volume id.
func lowerID(id string) string { return id + "-lower" }

// lowerPath is where the streaming tree under the volume mounted at target is mounted: beside
// target, in the directory kubelet made for it (shared with the host, as target is).
func lowerPath(target string) string {
	return filepath.Join(filepath.Dir(target), "."+filepath.Base(target)+".cistern-lower")
}

// streamsDataset says whether v's parameters (or, for a volume the driver adopted, its volume
// context's) ask for dataMode streaming. They were checked when the volume was made.
func streamsDataset(v state.Volume, volumeContext map[string]string) bool {
	m := v.Parameters
	if len(m) == 0 {
		m = volumeContext
	}
	return m[consts.ParamDataMode] == consts.DataModeStreaming
}

// streamOrAwait is the first staging's wait for a writable volume's dataset: a volume that asks
// to stream gets its streaming tree (lower) at once, unless the dataset is staged already
// (version: layered on the cache as any other) or this node cannot stream (the fallback Event
// said why: it waits for the staging as any other).
func (s *Service) streamOrAwait(ctx context.Context, v *state.Volume, spec *datasource.Spec, target string, secrets, volumeContext map[string]string) (lower, version string, err error) {
	if streamsDataset(*v, volumeContext) && !s.writable.Copy {
		lower, version, err = s.serveLower(ctx, v, spec, target, secrets, volumeContext)
		if lower != "" && version == "" {
			// A tree an earlier process left and this one refused at takeover (EIO): served
			// anew at the retry.
			if err := s.releaseStreamLower(ctx, v.ID); err != nil {
				return "", "", err
			}
			return "", "", status.Errorf(codes.Unavailable, "volume %s: the streaming tree left by an earlier process was let go; retry", v.ID)
		}
		if err != nil || lower != "" || version != "" {
			return lower, version, err
		}
	}
	version, err = s.awaitDataset(ctx, spec, v.Pool, usableBytes(v.CapacityBytes), secrets, volumeContext, claimWatch(*v, volumeContext))
	return "", version, err
}

// serveLower serves v's dataset as a streaming tree beside target and returns its path and the
// version the caller proved it reads; lower is empty when the tree is not served (see
// serveStreaming: the dataset is staged, version set, or the node cannot stream).
func (s *Service) serveLower(ctx context.Context, v *state.Volume, spec *datasource.Spec, target string, secrets, volumeContext map[string]string) (lower, version string, err error) {
	tv := &treeVolume{s: s, id: lowerID(v.ID), layerOf: v.ID}
	rec := state.TreeVolume{ID: tv.id, Pool: v.Pool, DatasetID: spec.ID(), Parameters: recordedAttrs(volumeContext),
		Path: lowerPath(target), LayerOf: v.ID}
	served, version, err := tv.serveStreaming(ctx, rec, spec, usableBytes(v.CapacityBytes), secrets, volumeContext)
	if err != nil || !served {
		return "", version, err
	}
	return rec.Path, version, nil
}

// layerStream layers v, whose own filesystem is mounted at target, on its streaming tree lower,
// of the dataset version the caller proved it reads: recorded first, as layerDataset does, then
// the overlay. A failure undoes both.
func (s *Service) layerStream(ctx context.Context, v *state.Volume, spec *datasource.Spec, version, lower, target string) error {
	v.DatasetLayer, v.DatasetVersion, v.DatasetStream = spec.ID(), version, true
	if err := s.store.PutVolume(*v); err != nil {
		v.DatasetLayer, v.DatasetStream = "", false
		return Internal("saving volume state", err)
	}
	if err := s.mountLayer(lower, target); err != nil {
		if uerr := s.unlayer(v, target); uerr != nil {
			return uerr
		}
		return Internal("mounting the overlay on the streaming dataset", err)
	}
	klog.FromContext(ctx).V(4).Info("Layered writable volume on streaming dataset", "volumeID", v.ID, "dataset", spec.String(), "lower", lower, "target", target)
	return nil
}

// remountStream mounts the overlay of a volume layered on a streaming tree again (a later
// staging): on the cached version once it is staged (settleStream), else on the dataset
// streamed again, which the caller proves it reads, and which must be the version the volume
// was made on: its upper layer records changes to those bytes.
func (s *Service) remountStream(ctx context.Context, v *state.Volume, spec *datasource.Spec, target string, secrets, volumeContext map[string]string) error {
	if s.settleStream(ctx, v, spec) {
		return s.remountLayer(*v, target)
	}
	lower, version, err := s.serveLower(ctx, v, spec, target, secrets, volumeContext)
	switch {
	case err != nil:
		return err
	case lower == "" && version == "":
		return status.Errorf(codes.Unavailable, "volume %s is layered on its dataset streamed, which this node cannot stream now, and the version it was made on is not staged yet; retry later", v.ID)
	case version != v.DatasetVersion:
		if lower != "" {
			_ = s.releaseStreamLower(ctx, v.ID)
		}
		return status.Errorf(codes.FailedPrecondition, "volume %s was made on another version of %s than its source lists now (it changed since): its changes apply to that version only", v.ID, spec.Describe())
	case lower == "":
		if !s.settleStream(ctx, v, spec) {
			return status.Errorf(codes.Unavailable, "the version of %s volume %s was made on is not on the node; retry", spec.Describe(), v.ID)
		}
		return s.remountLayer(*v, target)
	}
	if err := s.mountLayer(lower, target); err != nil {
		_ = s.releaseStreamLower(ctx, v.ID)
		return Internal("mounting the overlay on the streaming dataset", err)
	}
	return nil
}

// settleStream gives a volume layered on a streaming tree its reference on the cached version
// it was made on, once that version is staged: from then it is a layered volume as any other.
// It says whether v holds that reference (always, for a volume not streamed).
func (s *Service) settleStream(ctx context.Context, v *state.Volume, spec *datasource.Spec) bool {
	if !v.DatasetStream {
		return true
	}
	if v.DatasetVersion == "" {
		return false
	}
	if _, err := s.datasets.Serve(v.Pool, spec, v.DatasetVersion, v.ID); err != nil {
		klog.FromContext(ctx).V(4).Info("Streamed dataset not staged yet", "volumeID", v.ID, "reason", err.Error())
		return false
	}
	v.DatasetStream = false
	if err := s.store.PutVolume(*v); err != nil {
		v.DatasetStream = true
		_ = s.datasets.Unserve(v.Pool, v.DatasetLayer, v.ID)
		return false
	}
	klog.FromContext(ctx).V(4).Info("Volume layered on a streamed dataset now references its staged version", "volumeID", v.ID)
	return true
}

// streamSettled is settleStream for a volume whose dataset is not at hand: whether v holds its
// reference on the cached version (always, for a volume not on a streaming tree).
func (s *Service) streamSettled(ctx context.Context, v *state.Volume) (bool, error) {
	if !v.DatasetStream {
		return true, nil
	}
	spec, err := s.layerSpec(*v)
	if err != nil {
		return false, err
	}
	return s.settleStream(ctx, v, spec), nil
}

// letGoStream prepares the let-go (unstage, or an inline volume's unpublish) of a volume
// layered on a streaming tree: it takes the reference on the staged version if it can. A volume
// whose outputs are uploaded then (handsOff) needs it, as the upload reads the dataset version
// the volume was made on after the tree is gone: it is let go once its dataset is staged.
func (s *Service) letGoStream(ctx context.Context, v *state.Volume) error {
	settled, err := s.streamSettled(ctx, v)
	if err != nil {
		return err
	}
	if !settled && s.handsOff(*v) {
		return status.Errorf(codes.Unavailable, "volume %s: its outputs are uploaded once its dataset, which it streams, is staged on the node; retry later", v.ID)
	}
	return nil
}

// handOffStreamed is handOff, then the streaming tree, if any, goes: the overlay on it is gone,
// and the upload reads the staged version the volume now references (letGoStream).
func (s *Service) handOffStreamed(ctx context.Context, v state.Volume, path string, st *steps) error {
	if err := s.handOff(ctx, v, path, st); err != nil {
		return err
	}
	return s.releaseStreamLower(ctx, v.ID)
}

// settledLayer makes sure a layered volume about to be snapshotted or cloned references its
// cached version, which the snapshot or clone shares: a volume on a streaming tree does once its
// dataset is staged; before, Unavailable (the caller retries).
func (s *Service) settledLayer(v *state.Volume) error {
	settled, err := s.streamSettled(context.Background(), v)
	if err != nil {
		return err
	}
	if !settled {
		return status.Errorf(codes.Unavailable, "volume %s is layered on its dataset as it streams: it can be snapshotted or cloned once the dataset is staged on the node; retry later", v.ID)
	}
	return nil
}

// layerTree is the lower layer of a layered volume as the write-back reads it: the cached
// version it references, or, while it streams its dataset (a checkpoint), its streaming tree.
func (s *Service) layerTree(v state.Volume) (string, error) {
	tree, err := s.datasets.Layer(v.Pool, v.DatasetLayer, v.ID)
	if err == nil || !v.DatasetStream {
		return tree, err
	}
	if rec, ok := s.store.GetTreeVolume(lowerID(v.ID)); ok {
		if live, _ := s.streams.live(rec.ID, rec.Path); live {
			return rec.Path, nil
		}
	}
	return "", err
}

// layerSpec is the dataset of a volume layered on a streaming tree.
func (s *Service) layerSpec(v state.Volume) (*datasource.Spec, error) {
	rec, _ := s.store.GetTreeVolume(lowerID(v.ID))
	spec, err := volumeDataset(v, rec.Parameters)
	if err == nil && spec == nil {
		err = status.Errorf(codes.Internal, "volume %s is layered on a dataset but names none", v.ID)
	}
	return spec, err
}

// releaseStreamLower unmounts the streaming tree under volume id, if it has one, and drops its
// record and mount point: after the overlay on it is gone.
func (s *Service) releaseStreamLower(ctx context.Context, id string) error {
	rec, ok := s.store.GetTreeVolume(lowerID(id))
	if !ok {
		return nil
	}
	tv := &treeVolume{s: s, id: rec.ID, rec: &rec}
	if err := tv.release(ctx, rec.Path); err != nil {
		return err
	}
	if err := os.Remove(rec.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return Internal("removing the streaming tree's mount point", err)
	}
	return nil
}

// servedDataset is the dataset a streaming tree serves and the most it may take: its own
// parameters', or, for the lower layer of a writable volume, that volume's.
func (tv *treeVolume) servedDataset(rec state.TreeVolume) (*datasource.Spec, int64, error) {
	if rec.LayerOf == "" {
		use := params.StaticPV
		if rec.Inline {
			use = params.Inline
		}
		_, spec, capacity, err := tv.dataset(rec.Parameters, use)
		return spec, capacity, err
	}
	v, ok := tv.s.store.GetVolume(rec.LayerOf)
	if !ok {
		return nil, 0, fmt.Errorf("volume %s, whose lower layer it is, is not recorded", rec.LayerOf)
	}
	spec, err := tv.s.layerSpec(v)
	return spec, usableBytes(v.CapacityBytes), err
}
