package driver

import (
	"context"
	"maps"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/image"
	"github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/pool"
	"github.com/cistern-csi/cistern/pkg/state"
)

const ephemeralContextKey = "csi.storage.k8s.io/ephemeral"

func isEphemeral(volumeContext map[string]string) bool {
	return volumeContext[ephemeralContextKey] == "true"
}

// publishEphemeral creates a CSI inline volume in a pool on first publish and mounts it at the
// target directly; NodeUnpublishVolume deletes it.
func (d *Driver) publishEphemeral(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if req.GetVolumeCapability().GetBlock() != nil {
		return nil, status.Error(codes.InvalidArgument, "inline ephemeral volumes must be mount volumes")
	}
	pl, err := parseParams(req.GetVolumeContext(), params.Inline)
	if err != nil {
		return nil, err
	}
	// The record keeps the attributes without the size, which is the image's.
	attrs := maps.Clone(req.GetVolumeContext())
	delete(attrs, consts.ParamSize)
	shape := volumeShape{access: state.Mount, fsType: req.GetVolumeCapability().GetMount().GetFsType()}
	if shape.fsType == "" {
		shape.fsType = defaultFSType
	}
	var rng *csi.CapacityRange
	if pl.Size > 0 {
		rng = &csi.CapacityRange{RequiredBytes: pl.Size}
	}
	size, err := volumeSize(rng, shape, d.cfg.DefaultVolumeSize)
	if err != nil {
		return nil, err
	}

	v, exists := d.store.GetVolume(id)
	if !exists {
		chosen, err := d.selectPool(pl, size)
		if err != nil {
			return nil, err
		}
		v = state.Volume{
			ID: id, Name: id, Pool: chosen.Name, CapacityBytes: size, AccessType: state.Mount,
			FSType: shape.fsType, Parameters: attrs, Ephemeral: true, CreatedAt: time.Now().UTC(),
		}
		if err := d.store.PutVolume(v); err != nil {
			return nil, internal("saving volume state", err)
		}
		if err := d.images.Create(image.VolumePath(chosen.Path, pool.MetaDir, id), size); err != nil {
			_ = d.store.DeleteVolume(id)
			return nil, d.imageError("creating volume image", chosen.Name, err)
		}
		v.Ready = true
		if err := d.store.PutVolume(v); err != nil {
			return nil, internal("saving volume state", err)
		}
	}
	flags := req.GetVolumeCapability().GetMount().GetMountFlags()
	if req.GetReadonly() {
		flags = append(append([]string(nil), flags...), "ro")
	}
	dev, err := d.mountImage(ctx, &v, target, flags, req.GetVolumeContext(), req.GetSecrets())
	if err != nil {
		return nil, err
	}
	v.Device = dev
	v.Published = map[string]bool{target: req.GetReadonly()}
	if err := d.store.PutVolume(v); err != nil {
		return nil, internal("saving volume state", err)
	}
	d.pools.UpdateCapacity(v.Pool)
	klog.FromContext(ctx).V(4).Info("Published inline volume", "volumeID", id, "pool", v.Pool, "target", target)
	return &csi.NodePublishVolumeResponse{}, nil
}

// deleteEphemeral removes an inline volume once its target is unmounted.
func (d *Driver) deleteEphemeral(v state.Volume) error {
	if v.Device != "" {
		if err := d.images.Detach(v.Device); err != nil {
			return internal("detaching loop device", err)
		}
	}
	return d.deleteVolume(v)
}
