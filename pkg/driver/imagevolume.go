package driver

import (
	"context"

	mount "k8s.io/mount-utils"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/state"
)

// attachImage binds the volume's image to a loop device and applies its mutable parameters.
func (d *Driver) attachImage(v state.Volume) (string, error) {
	img, err := d.volumeImage(v)
	if err != nil {
		return "", err
	}
	dev, err := d.images.Attach(img)
	if err != nil {
		return "", internal("attaching volume image", err)
	}
	if err := applyMutable(dev, v.MutableParameters); err != nil {
		_ = d.images.Detach(dev)
		return "", internal("applying mutable parameters", err)
	}
	return dev, nil
}

// mountImage makes an image-backed mount volume (staged or inline) usable at target and returns
// its loop device. The order keeps kubelet's retries cheap and the volume safe:
//
//  1. the dataset, if any, is staged first: while it downloads, a retry touches nothing on the
//     node (no attach, mkfs, mount, umount, detach);
//  2. attach, format on first use, mount; a new filesystem is recorded durably at once, so no
//     later attempt formats it again;
//  3. the dataset is copied in once and that is recorded too.
//
// On failure nothing stays mounted or attached. v is updated with what was recorded.
func (d *Driver) mountImage(ctx context.Context, v *state.Volume, target string, flags []string, volumeContext, secrets map[string]string) (string, error) {
	spec, err := volumeDataset(*v, volumeContext)
	if err != nil {
		return "", err
	}
	fill := spec != nil && !v.DatasetFilled
	if fill {
		if err := d.awaitDataset(ctx, spec, v.Pool, usableBytes(v.CapacityBytes), secrets); err != nil {
			return "", err
		}
	}
	dev, err := d.attachImage(*v)
	if err != nil {
		return "", err
	}
	undo := func(err error) (string, error) {
		_ = mount.CleanupMountPoint(target, d.mounter, true)
		_ = d.images.Detach(dev)
		return "", err
	}
	if err := d.mountStaging(dev, target, *v, flags); err != nil {
		return undo(err)
	}
	if !v.Formatted || v.NeedsGrow {
		// A lost Formatted flag would let a later stage format over data: write it durably.
		v.Formatted, v.NeedsGrow = true, false
		if err := d.store.PutVolume(*v); err != nil {
			return undo(internal("saving volume state", err))
		}
	}
	if fill {
		if !datasource.Populated(target, spec) {
			if err := d.populateDataset(ctx, spec, v.Pool, target); err != nil {
				return undo(err)
			}
		}
		v.DatasetFilled = true
		if err := d.store.PutVolume(*v); err != nil {
			return undo(internal("saving volume state", err))
		}
	}
	return dev, nil
}
