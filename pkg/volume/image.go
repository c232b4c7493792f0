package volume

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/ids"
	"github.com/cistern-csi/cistern/pkg/image"
	"github.com/cistern-csi/cistern/pkg/pool"
	"github.com/cistern-csi/cistern/pkg/state"
	"github.com/cistern-csi/cistern/pkg/testpoint"
)

// imageVolume is a volume with an image on a pool: staged and published, or inline.
type imageVolume struct {
	s  *Service
	id string
}

func (iv *imageVolume) Kind() Kind { return KindImage }

// Stage attaches the image to a loop device and, for a mount volume, prepares its dataset,
// formats it on first use, mounts it at the staging path and fills it (mountImage).
func (iv *imageVolume) Stage(ctx context.Context, r StageRequest) error {
	s := iv.s
	v, err := s.Lookup(iv.id)
	if err != nil {
		return err
	}
	if v.AccessType == "" { // adopted from its image: the capability tells
		v.AccessType, v.FSType = state.Mount, r.FSType
		if r.Block {
			v.AccessType, v.FSType = state.Block, ""
		}
	}
	if err := s.checkStageOutput(ctx, v, r); err != nil {
		return err
	}
	if err := Fits(v, r.Block, r.FSType); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if v.StagingPath != "" && v.StagingPath != r.Path {
		return status.Errorf(codes.FailedPrecondition, "volume %s is already staged at %s", iv.id, v.StagingPath)
	}
	var dev string
	unsaved := false // a change that must be written durably
	if v.AccessType == state.Mount {
		spec, serr := volumeDataset(v, r.VolumeContext)
		if serr != nil {
			return serr
		}
		if podIdentity(spec) && !v.DatasetFilled && v.DatasetLayer == "" {
			return s.stagePending(ctx, v, r.Path) // no pod token yet: webidentity.go
		}
		dev, unsaved, err = s.mountImage(ctx, &v, r.Path, r.MountFlags, r.VolumeContext, r.Secrets)
	} else {
		dev, err = s.attach(v)
	}
	if err != nil {
		return err
	}
	v.StagingPath, v.Device = r.Path, dev
	put := s.store.PutVolumeNodeState
	if unsaved {
		put = s.store.PutVolume
	}
	if err := put(v); err != nil {
		return Internal("saving volume state", err)
	}
	s.startCheckpoints(v)
	klog.FromContext(ctx).V(4).Info("Staged volume", "volumeID", iv.id, "device", dev, "path", r.Path)
	return nil
}

// Unstage unmounts the staging path and detaches the loop device.
func (iv *imageVolume) Unstage(ctx context.Context, path string) error {
	s := iv.s
	st := newSteps()
	defer st.log(ctx, "Unstage steps", iv.id)
	v, ok := s.store.GetVolume(iv.id)
	if ok {
		if err := s.letGoStream(ctx, &v); err != nil {
			return err
		}
	}
	s.stopCheckpoints(iv.id)
	s.ready.forget(iv.id)
	s.staging.forget(iv.id)
	st.done("checkpoints")
	if ok && s.handsOff(v) {
		return s.handOffStreamed(ctx, v, path, st)
	}
	if err := unmountTargetSteps(s.mounter, path, st); err != nil {
		return Internal("unmounting staging path", err)
	}
	if err := s.releaseStreamLower(ctx, iv.id); err != nil {
		return err
	}
	if !ok {
		if ids.PoolOfVolumeID(iv.id) == "" {
			return status.Errorf(codes.NotFound, "volume %s does not exist", iv.id)
		}
		v = state.Volume{ID: iv.id, Pool: ids.PoolOfVolumeID(iv.id)}
	}
	dev := v.Device
	if img, err := s.ImagePath(v); err == nil {
		if found, _ := s.images.Find(img); found != "" {
			dev = found
		}
	}
	if err := s.images.Detach(dev); err != nil {
		return Internal("detaching loop device", err)
	}
	if ok {
		v.StagingPath, v.Device, v.StagePending = "", "", false
		if err := s.store.PutVolumeNodeState(v); err != nil {
			return Internal("saving volume state", err)
		}
	}
	klog.FromContext(ctx).V(4).Info("Unstaged volume", "volumeID", iv.id)
	return nil
}

// Publish bind-mounts the staged filesystem (or the loop device, for block) to the target,
// read-only when asked. An inline volume is created and mounted at the target instead.
func (iv *imageVolume) Publish(ctx context.Context, r PublishRequest) error {
	s := iv.s
	if r.Inline != nil {
		return iv.publishInline(ctx, r)
	}
	if r.StagingPath == "" {
		return status.Error(codes.InvalidArgument, "staging target path is required")
	}
	v, err := s.Lookup(iv.id)
	if err != nil {
		return err
	}
	if err := Fits(v, r.Block, r.FSType); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if v.StagingPath != r.StagingPath || v.Device == "" && !v.StagePending {
		return status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s", iv.id, r.StagingPath)
	}
	for other := range v.Published {
		if other != r.Target && (r.SingleWriter || v.ExclusiveTarget != "") {
			return status.Errorf(codes.FailedPrecondition, "volume %s is published at %s for a single writer", iv.id, other)
		}
	}
	if s.inPlace(v.Published, r.Target) {
		return nil // a republish (republish.go): its pod proved its right when it was published
	}
	if v.AccessType == state.Mount {
		spec, err := volumeDataset(v, r.VolumeContext)
		if err != nil {
			return err
		}
		if podIdentity(spec) { // each publishing pod proves its own right: webidentity.go
			if err := s.publishPodIdentity(ctx, &v, spec, r); err != nil {
				return err
			}
		}
	}
	source := r.StagingPath
	if v.AccessType == state.Block {
		source = v.Device
	}
	if err := s.bindMount(source, r.Target, v.AccessType == state.Block, r.ReadOnly, r.MountFlags); err != nil {
		return err
	}
	if v.Published == nil {
		v.Published = map[string]bool{}
	}
	v.Published[r.Target] = r.ReadOnly
	if r.SingleWriter {
		v.ExclusiveTarget = r.Target
	}
	if err := s.store.PutVolumeNodeState(v); err != nil {
		return Internal("saving volume state", err)
	}
	s.publishedOutput(v.Parameters)
	klog.FromContext(ctx).V(4).Info("Published volume", "volumeID", iv.id, "target", r.Target, "readOnly", r.ReadOnly)
	return nil
}

// publishInline creates an inline volume in a pool on first publish and mounts it at the target
// directly, through the same path as a staged volume; Unpublish deletes it.
func (iv *imageVolume) publishInline(ctx context.Context, r PublishRequest) error {
	s, id := iv.s, iv.id
	if r.Block {
		return status.Error(codes.InvalidArgument, "inline ephemeral volumes must be mount volumes")
	}
	v, exists := s.store.GetVolume(id)
	if exists && s.inPlace(v.Published, r.Target) {
		return nil // a republish (republish.go)
	}
	if !exists {
		if p := r.Inline.Params; p.OutputTarget != "" {
			spec := datasource.SpecOf(p.Dataset)
			spec.Tenant = true
			if err := s.checkOutput(ctx, id, p.OutputTarget, spec, r.Secrets, r.VolumeContext); err != nil {
				return err
			}
		}
		chosen, err := s.selectInlinePool(r.Inline.Params, r.Inline.Size, r.Inline.Size)
		if err != nil {
			return err
		}
		// The record keeps the attributes without the size, which is the image's.
		attrs := recordedAttrs(r.VolumeContext, consts.ParamSize)
		v = state.Volume{ID: id, Name: id, Pool: chosen.Name, CapacityBytes: r.Inline.Size, Parameters: attrs}
		if err := s.createEphemeral(&v, chosen.Path, r.FSType); err != nil {
			return err
		}
	}
	return s.mountEphemeral(ctx, v, r)
}

// createEphemeral records v as an ephemeral mount volume and creates its image in the pool at
// poolPath; nothing is left behind when it fails.
func (s *Service) createEphemeral(v *state.Volume, poolPath, fsType string) error {
	if fsType == "" {
		fsType = DefaultFSType
	}
	v.AccessType, v.FSType, v.Ephemeral, v.CreatedAt = state.Mount, fsType, true, time.Now().UTC()
	if err := s.store.PutVolume(*v); err != nil {
		return Internal("saving volume state", err)
	}
	if err := s.images.Create(image.VolumePath(poolPath, pool.MetaDir, v.ID), v.CapacityBytes); err != nil {
		_ = s.store.DeleteVolume(v.ID)
		return s.ImageError("creating volume image", v.Pool, err)
	}
	v.Ready = true
	if err := s.store.PutVolume(*v); err != nil {
		return Internal("saving volume state", err)
	}
	return nil
}

// mountEphemeral mounts an ephemeral volume (inline, or a writable copy) at the target, filling
// it from its dataset on first use.
func (s *Service) mountEphemeral(ctx context.Context, v state.Volume, r PublishRequest) error {
	flags := r.MountFlags
	if r.ReadOnly {
		flags = append(append([]string(nil), flags...), "ro")
	}
	dev, _, err := s.mountImage(ctx, &v, r.Target, flags, r.VolumeContext, r.Secrets)
	if err != nil {
		return err
	}
	v.Device = dev
	v.Published = map[string]bool{r.Target: r.ReadOnly}
	if err := s.store.PutVolume(v); err != nil {
		return Internal("saving volume state", err)
	}
	s.pools.UpdateCapacity(v.Pool)
	s.startCheckpoints(v)
	klog.FromContext(ctx).V(4).Info("Published ephemeral volume", "volumeID", v.ID, "pool", v.Pool, "target", r.Target, "copyOf", v.CopyOf)
	return nil
}

// Unpublish unmounts the target; an inline volume is deleted with it.
func (iv *imageVolume) Unpublish(ctx context.Context, target string) error {
	s := iv.s
	st := newSteps()
	defer st.log(ctx, "Unpublish steps", iv.id)
	if v, ok := s.store.GetVolume(iv.id); ok && v.Ephemeral {
		if err := s.letGoStream(ctx, &v); err != nil {
			return err
		}
		s.stopCheckpoints(iv.id) // in use until here: its final upload follows
		st.done("checkpoints")
		if s.handsOff(v) {
			return s.handOffStreamed(ctx, v, target, st)
		}
	}
	if err := unmountTargetSteps(s.mounter, target, st); err != nil {
		return Internal("unmounting target path", err)
	}
	if err := s.releaseStreamLower(ctx, iv.id); err != nil {
		return err
	}
	v, ok := s.store.GetVolume(iv.id)
	if !ok {
		return nil
	}
	if v.Ephemeral {
		if v.Device != "" {
			if err := s.images.Detach(v.Device); err != nil {
				return Internal("detaching loop device", err)
			}
			st.done("detach")
		}
		err := s.Delete(v)
		st.done("delete")
		return err
	}
	if _, published := v.Published[target]; published {
		delete(v.Published, target)
		if v.ExclusiveTarget == target {
			v.ExclusiveTarget = ""
		}
		if err := s.store.PutVolumeNodeState(v); err != nil {
			return Internal("saving volume state", err)
		}
	}
	klog.FromContext(ctx).V(4).Info("Unpublished volume", "volumeID", iv.id, "target", target)
	return nil
}

// attach binds the volume's image to a loop device and applies its mutable parameters.
func (s *Service) attach(v state.Volume) (string, error) {
	img, err := s.ImagePath(v)
	if err != nil {
		return "", err
	}
	dev, err := s.images.Attach(img)
	if err != nil {
		return "", Internal("attaching volume image", err)
	}
	if err := ApplyMutable(dev, v.MutableParameters); err != nil {
		_ = s.images.Detach(dev)
		return "", Internal("applying mutable parameters", err)
	}
	return dev, nil
}

// mountImage makes an image-backed mount volume (staged or inline) usable at target and returns
// its loop device. The order keeps kubelet's retries cheap and the volume safe:
//
//  1. the dataset, if any, is staged first and the caller proves it may read it: while it
//     downloads, a retry touches nothing on the node (no attach, mkfs, mount, umount, detach);
//  2. attach, format on first use, mount; a new filesystem is recorded durably before anything
//     else can fail, so no later attempt formats it again;
//  3. the volume is layered on the cached dataset (an overlay on the same path, layer.go), or on
//     its streaming tree (dataMode streaming, streamlayer.go: served in step 1, before the
//     dataset is staged), or, where it cannot be or the administrator asks for copies, the
//     dataset is copied in once; either is recorded too, and a layered volume gets its overlay
//     again at each later mount.
//
// On failure nothing stays mounted or attached, and no streaming tree served. v is updated; unsaved says it holds a change the
// caller must write durably (a new filesystem with no fill after it: one write instead of two).
func (s *Service) mountImage(ctx context.Context, v *state.Volume, target string, flags []string, volumeContext, secrets map[string]string) (dev string, unsaved bool, err error) {
	spec, err := volumeDataset(*v, volumeContext)
	if err != nil {
		return "", false, err
	}
	fill := spec != nil && !v.DatasetFilled && v.DatasetLayer == ""
	var version string // of the dataset, which the caller proved it may read
	var lower string   // its streaming tree, when it streams
	if fill {
		s.ready.start(v.ID)
		if lower, version, err = s.streamOrAwait(ctx, v, spec, target, secrets, volumeContext); err != nil {
			return "", false, err
		}
	}
	if lower != "" {
		defer func() {
			if err != nil {
				_ = s.releaseStreamLower(ctx, v.ID)
			}
		}()
	}
	if dev, err = s.attach(*v); err != nil {
		return "", false, err
	}
	testpoint.Reach(testpoint.ImageAttached, v.ID)
	if v.DatasetLayer != "" && isOverlay(target) {
		return dev, false, nil // mounted by an earlier attempt
	}
	undo := func(err error) (string, bool, error) {
		_ = unmountTarget(s.mounter, target) // the overlay too, when it was stacked
		_ = s.images.Detach(dev)
		return "", false, err
	}
	if err := s.mountDevice(dev, target, *v, flags); err != nil {
		return undo(err)
	}
	testpoint.Reach(testpoint.ImageMounted, v.ID)
	if !v.Formatted || v.NeedsGrow {
		// A lost Formatted flag would let a later stage format over data.
		v.Formatted, v.NeedsGrow = true, false
		if !fill && v.DatasetLayer == "" {
			return dev, true, nil
		}
		if err := s.store.PutVolume(*v); err != nil {
			return undo(Internal("saving volume state", err))
		}
	}
	switch {
	case v.DatasetLayer != "" && !hasLayer(target):
		// Recorded, then interrupted before its first overlay: start it again, proof first.
		if err := s.unlayer(v, target); err != nil {
			return undo(err)
		}
		return undo(status.Errorf(codes.Aborted, "the layering of volume %s on its dataset was interrupted; retry", v.ID))
	case v.DatasetLayer != "" && v.DatasetStream:
		if err := s.remountStream(ctx, v, spec, target, secrets, volumeContext); err != nil {
			return undo(err)
		}
	case v.DatasetLayer != "":
		if err := s.remountLayer(*v, target); err != nil {
			return undo(err)
		}
	case lower != "":
		if err := s.layerStream(ctx, v, spec, version, lower, target); err != nil {
			return undo(err)
		}
		s.ready.ready(v.ID, readyStream)
	case fill:
		if err := s.fillOrLayer(ctx, v, spec, version, target); err != nil {
			return undo(err)
		}
		testpoint.Reach(testpoint.ImageFilled, v.ID)
		s.ready.ready(v.ID, filledMode(*v))
	}
	return dev, false, nil
}

// fillOrLayer gives a new writable volume, whose filesystem is mounted at target, the dataset
// version the caller proved it may read: layered on the cache, or copied in. Either is recorded.
func (s *Service) fillOrLayer(ctx context.Context, v *state.Volume, spec *datasource.Spec, version, target string) error {
	v.DatasetVersion = version
	layered, err := s.layerDataset(ctx, v, spec, version, target)
	if err != nil || layered {
		return err
	}
	if v.Parameters[consts.ParamOutputTarget] != "" {
		// A copy has no record of what the pods changed: its outputs would be lost at unpublish.
		return status.Errorf(codes.FailedPrecondition, "volume %s names an %s but cannot be layered on its dataset on node %s (see its Events); a copy could not tell its outputs", v.ID, consts.ParamOutputTarget, s.nodeID)
	}
	if err := s.fillDataset(ctx, spec, version, v.Pool, target); err != nil {
		return err
	}
	v.DatasetFilled = true
	if err := s.store.PutVolume(*v); err != nil {
		return Internal("saving volume state", err)
	}
	return nil
}

// Expand makes the loop device of a staged volume see its grown image and grows the filesystem
// online (at mountPath) unless the volume is a block volume. It returns the device size.
func (s *Service) Expand(ctx context.Context, id, mountPath string, block bool) (int64, error) {
	v, err := s.Lookup(id)
	if err != nil {
		return 0, err
	}
	img, err := s.ImagePath(v)
	if err != nil {
		return 0, err
	}
	dev, err := s.images.Find(img)
	if err != nil {
		return 0, Internal("finding loop device", err)
	}
	if dev == "" {
		return 0, status.Errorf(codes.FailedPrecondition, "volume %s is not staged on this node", id)
	}
	if err := s.images.RefreshSize(dev); err != nil {
		return 0, Internal("refreshing loop device size", err)
	}
	size, err := s.images.DeviceSize(dev)
	if err != nil {
		return 0, Internal("reading device size", err)
	}
	if v.AccessType == state.Block || block {
		return size, nil
	}
	if v.DatasetLayer != "" {
		// The overlay stacked on the path hides the volume's own filesystem, which xfs_growfs
		// needs by a mount point: a second mount of the device, the same filesystem.
		dir, unmount, err := s.mountAside(dev, v.FSType)
		if err != nil {
			return 0, Internal("mounting the layered volume's filesystem to grow it", err)
		}
		defer unmount()
		mountPath = dir
	}
	if _, err := s.resizer.Resize(dev, mountPath); err != nil {
		if strings.Contains(err.Error(), "Permission denied") {
			return 0, status.Errorf(codes.Internal, "growing filesystem online was refused (an ext4 online resize needs CAP_SYS_RESOURCE in the node plugin): %v", err)
		}
		return 0, Internal("growing filesystem", err)
	}
	return size, nil
}

// ApplyMutable sets the loop device's read-ahead when the volume's mutable parameters ask for
// one.
func ApplyMutable(dev string, mutable map[string]string) error {
	ra, ok := mutable[consts.ParamReadAheadKiB]
	if !ok || dev == "" {
		return nil
	}
	path := filepath.Join("/sys/block", filepath.Base(dev), "queue", "read_ahead_kb")
	if err := os.WriteFile(path, []byte(ra), 0o644); err != nil {
		return fmt.Errorf("setting read-ahead of %s: %w", dev, err)
	}
	return nil
}
