package volume

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/state"
)

// A writable volume of a cached dataset is layered (docs/datasets.md, "Writable volumes"): its
// own filesystem (the image, capacity-enforced) is mounted at the staging or target path as
// before, and an overlay is stacked on that same path whose lower layer is the cached tree and
// whose upper layer is a directory of the volume's filesystem. Nothing is copied: the volume is
// ready as soon as both mounts are made. The volume's filesystem holds
//
//	upper/  what its pods changed: new and modified files, whiteouts for deletions (the layout
//	        of overlayfs, which the write-back of issue 26 reads; LayerChanges lists it)
//	work/   overlayfs' scratch space
//
// Stacking both mounts on one path keeps every other part of the driver as it was: one path per
// staged or published volume, unmountTarget peels both, kubelet sees one mount (the overlay).

// The directories of a layered volume's own filesystem.
const (
	LayerUpperDir = "upper"
	layerWorkDir  = "work"
)

// overlayMagic is the f_type statfs reports for an overlay (OVERLAYFS_SUPER_MAGIC).
const overlayMagic = 0x794c7630

// overlayOptions are tried in order. metacopy copies up only the metadata of a file whose mode
// or owner changes (kubelet's recursive chown of an fsGroup pod would otherwise copy every
// byte of the dataset into the volume), and needs redirect_dir; kernels older than 4.19 know
// neither, and get the plain overlay. index stays off: the lower layer is replaced (retired)
// only by a rename of its parent, and the volume's reference keeps the version it was made on.
var overlayOptions = []string{"redirect_dir=on,metacopy=on,index=off", "index=off"}

// WritableDatasets configures writable volumes of a cached dataset.
type WritableDatasets struct {
	// Copy fills every writable dataset volume with a full copy of the cached dataset instead
	// of layering it (--writable-datasets=copy).
	Copy bool
	// OnCopy, when set, is told about a volume that was to be layered and is copied instead,
	// and why (an Event on the node).
	OnCopy func(volumeID, dataset, reason string)
	// OverlayMount, when set, replaces the overlay mount(2) (mountOverlay): tests play a kernel
	// without overlayfs with it.
	OverlayMount func(options, target string) error
	// WriteBack uploads the volumes' changes to their output targets (writeback.go).
	WriteBack WriteBack
}

// hasLayer says whether the filesystem mounted at target holds a layer's upper directory: made
// with the first overlay, after the reference was taken.
func hasLayer(target string) bool {
	_, err := os.Stat(filepath.Join(target, LayerUpperDir))
	return err == nil
}

// isOverlay says whether the top mount at path is an overlay (a layered volume mounted there).
func isOverlay(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && int64(st.Type) == overlayMagic
}

// layerDataset makes v, whose own filesystem is mounted at target, a layer over the cached
// version of spec the caller proved it may read: it references that version for v first
// (recorded durably, so a crash leaves nothing Delete does not release), then mounts the
// overlay. It returns false, having undone both, when the volume must be copied instead: the
// administrator asked for copies, or the overlay cannot be mounted here (which it reports).
func (s *Service) layerDataset(ctx context.Context, v *state.Volume, spec *datasource.Spec, version, target string) (bool, error) {
	logger := klog.FromContext(ctx).WithValues("volumeID", v.ID, "dataset", spec.String())
	if s.writable.Copy {
		logger.V(2).Info("Copying dataset into writable volume (--writable-datasets=copy)")
		return false, nil
	}
	v.DatasetLayer = spec.ID()
	if err := s.store.PutVolume(*v); err != nil {
		v.DatasetLayer = ""
		return false, Internal("saving volume state", err)
	}
	tree, err := s.datasets.Serve(v.Pool, spec, version, v.ID)
	if err != nil {
		if uerr := s.unlayer(v, target); uerr != nil {
			return false, uerr
		}
		return false, status.Error(datasource.Code(err), err.Error())
	}
	if err := s.mountLayer(tree, target); err != nil {
		if uerr := s.unlayer(v, target); uerr != nil {
			return false, uerr
		}
		logger.Info("Cannot layer writable volume on the cached dataset; copying it instead", "reason", err.Error())
		if s.writable.OnCopy != nil {
			s.writable.OnCopy(v.ID, spec.String(), err.Error())
		}
		return false, nil
	}
	logger.V(4).Info("Layered writable volume on cached dataset", "tree", tree, "target", target)
	return true, nil
}

// unlayer drops what a failed layerDataset made: the layer's directories and the reference.
func (s *Service) unlayer(v *state.Volume, target string) error {
	_ = os.RemoveAll(filepath.Join(target, LayerUpperDir))
	_ = os.RemoveAll(filepath.Join(target, layerWorkDir))
	if err := s.releaseStreamLower(context.Background(), v.ID); err != nil {
		return err
	}
	if err := s.releaseLayer(v.Pool, v.DatasetLayer, v.ID); err != nil {
		return Internal("releasing dataset", err)
	}
	v.DatasetLayer, v.DatasetStream = "", false
	if err := s.store.PutVolume(*v); err != nil {
		return Internal("saving volume state", err)
	}
	return nil
}

// remountLayer mounts the overlay of a layered volume again (a later staging): on the version
// its reference holds, which need not be the dataset's ready version any more.
func (s *Service) remountLayer(v state.Volume, target string) error {
	tree, err := s.datasets.Layer(v.Pool, v.DatasetLayer, v.ID)
	if err != nil {
		return status.Errorf(datasource.Code(err), "the lower layer of volume %s: %v", v.ID, err)
	}
	if err := s.mountLayer(tree, target); err != nil {
		return Internal("mounting overlay", err)
	}
	return nil
}

// mountLayer stacks an overlay of lower and the upper directory of the filesystem mounted at
// target on target itself.
func (s *Service) mountLayer(lower, target string) error {
	upper, work := filepath.Join(target, LayerUpperDir), filepath.Join(target, layerWorkDir)
	for _, p := range []string{lower, upper, work} {
		// The legacy mount(2) options split on commas, and lowerdir on colons.
		if strings.ContainsAny(p, ",:\\") {
			return fmt.Errorf("path %q has a character overlay options cannot carry", p)
		}
	}
	if err := os.MkdirAll(upper, 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	base := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
	var errs []error
	for _, opts := range overlayOptions {
		err := s.overlayMount(base+","+opts, target)
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("mount -t overlay -o %s: %w", opts, err))
	}
	return errors.Join(errs...)
}

// mountOverlay is the overlay mount(2) (Service.overlayMount, with volumeFlags); tests replace
// it to play a kernel without overlayfs.
func mountOverlay(options, target string, flags uintptr) error {
	return unix.Mount("overlay", target, "overlay", flags, options)
}

// mountAside mounts the filesystem of dev (mounted already: the superblock is shared) on a
// temporary directory, for a tool that needs it by a mount point the overlay does not hide.
func (s *Service) mountAside(dev, fsType string) (string, func(), error) {
	dir, err := os.MkdirTemp("", "cistern-layered-")
	if err != nil {
		return "", nil, err
	}
	if err := mountFilesystem(dev, dir, fsType, 0); err != nil {
		_ = os.Remove(dir)
		return "", nil, fmt.Errorf("mount %s: %w", dev, err)
	}
	return dir, func() {
		_ = unix.Unmount(dir, 0)
		_ = os.Remove(dir)
	}, nil
}

// releaseLayer drops holder's reference on its dataset layer; no layer, nothing to drop.
func (s *Service) releaseLayer(poolName, layer, holder string) error {
	if layer == "" {
		return nil
	}
	return s.datasets.Unserve(poolName, layer, holder)
}
