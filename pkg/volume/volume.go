// Package volume is the node's volume engine under the thin CSI layer of pkg/driver. It holds
// volumes of two kinds behind one interface (Volume):
//
//	image  a sparse image file on a pool, attached to a loop device, formatted on first use and
//	       mounted; persistent (CreateVolume) or inline (created by NodePublish, deleted by
//	       NodeUnpublish); filled once from a dataset when its parameters name one
//	tree   a dataset's cached tree on a pool, bind-mounted read-only: a static PV naming a
//	       source, or a read-only inline volume naming one
//
// Open decides a volume's kind once, from its record, its ID and its attributes; no RPC probes
// the disk to learn it. Errors are gRPC status errors, which pkg/driver returns unchanged.
package volume

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/ids"
	"github.com/cistern-csi/cistern/pkg/image"
	"github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/pool"
	"github.com/cistern-csi/cistern/pkg/state"
)

// Pools is what the service needs of the node's pools; pkg/pool's Manager implements it.
type Pools interface {
	Get(name string) (pool.Status, bool)
	List() ([]pool.Status, uint64)
	UpdateCapacity(name string)
	RecordError(name, message string)
}

// Config is what a Service works with; every field is required.
type Config struct {
	NodeID   string
	Store    *state.Store
	Pools    Pools
	Images   Images
	Mounter  *mount.SafeFormatAndMount
	Resizer  *mount.ResizeFs
	Datasets *datasource.Datasets
	// Inline bounds what a pod author's inline volumes may take.
	Inline InlineLimits
	// Writable configures writable volumes of a dataset (layer.go); the zero value layers them.
	Writable WritableDatasets
	// Streaming configures streaming dataset volumes (stream.go).
	Streaming StreamingVolumes
	// DevSuid mounts volumes without nodev,nosuid (--volume-dev-suid; mount.go).
	DevSuid bool
	// Staging configures the progress Events of the stagings volumes wait for
	// (staging_events.go); the zero value posts none.
	Staging StagingEvents
}

// InlineLimits bound inline ephemeral volumes, which any pod author writes: their size (a
// writable copy's image, or the dataset a read-only one may cache) and the pools they may use.
type InlineLimits struct {
	// MaxBytes is the largest inline volume, and the largest dataset a read-only inline volume
	// may cache when it names no size. 0: unlimited.
	MaxBytes int64
	// Pools are the pools inline volumes may use; empty: every pool.
	Pools []string
}

// Service stages, publishes and releases the node's volumes.
type Service struct {
	nodeID   string
	store    *state.Store
	pools    Pools
	images   Images
	mounter  *mount.SafeFormatAndMount
	resizer  *mount.ResizeFs
	datasets *datasource.Datasets
	inline   InlineLimits
	writable WritableDatasets
	// overlayMount mounts an overlay with the given options: mountOverlay but in tests.
	overlayMount func(options, target string) error
	// devSuid: volumes mounted without nodev,nosuid (Config.DevSuid).
	devSuid bool
	// streams are the streaming volumes this process serves (stream.go).
	streams   *streamMounts
	streaming StreamingVolumes
	// wb uploads volumes' outputs (writeback.go); nil when write-back is off.
	wb *writeBacks
	// ready times dataset volumes to their data being ready (ready_metrics.go).
	ready *readyClock
	// staging reports the progress of the stagings volumes wait for (staging_events.go); nil
	// when its Events are off.
	staging *stagingReports
}

// New returns a Service over cfg.
func New(cfg Config) *Service {
	s := &Service{nodeID: cfg.NodeID, store: cfg.Store, pools: cfg.Pools, images: cfg.Images,
		mounter: cfg.Mounter, resizer: cfg.Resizer, datasets: cfg.Datasets, inline: cfg.Inline,
		writable: cfg.Writable, overlayMount: cfg.Writable.OverlayMount,
		streams: newStreamMounts(cfg.Streaming), streaming: cfg.Streaming, devSuid: cfg.DevSuid,
		ready: newReadyClock(), staging: newStagingReports(cfg.Staging)}
	if s.overlayMount == nil {
		s.overlayMount = func(options, target string) error { return mountOverlay(options, target, s.volumeFlags()) }
	}
	if s.wb = newWriteBacks(cfg.Writable.WriteBack); s.wb != nil {
		s.wb.node = cfg.NodeID
	}
	return s
}

// Store returns the records; tests read and plant them through it.
func (s *Service) Store() *state.Store { return s.store }

// Images returns the image operations, which the controller side shares.
func (s *Service) Images() Images { return s.images }

// Kind is how a volume is held on the node.
type Kind string

const (
	KindImage Kind = "image"
	KindTree  Kind = "tree"
)

// Access is what a volume capability asks of a volume.
type Access struct {
	Block      bool
	FSType     string
	MountFlags []string
	// SingleWriter is SINGLE_NODE_SINGLE_WRITER: one publication at a time.
	SingleWriter bool
	// ReaderOnly is a reader-only access mode (SINGLE_NODE_READER_ONLY, MULTI_NODE_READER_ONLY):
	// a ReadOnlyMany PersistentVolume, never a writable copy.
	ReaderOnly bool
}

// StageRequest is a NodeStageVolume, validated.
type StageRequest struct {
	Path string
	Access
	VolumeContext, Secrets map[string]string
}

// PublishRequest is a NodePublishVolume, validated.
type PublishRequest struct {
	Target      string
	StagingPath string
	ReadOnly    bool
	Access
	VolumeContext, Secrets map[string]string
	// Inline describes an inline volume to create on first publish; nil otherwise.
	Inline *Inline
}

// Inline is an inline image volume to create: its parsed attributes and its size.
type Inline struct {
	Params params.Volume
	Size   int64
}

// Volume is one volume of this node, of either kind.
type Volume interface {
	Kind() Kind
	Stage(ctx context.Context, r StageRequest) error
	Unstage(ctx context.Context, path string) error
	Publish(ctx context.Context, r PublishRequest) error
	Unpublish(ctx context.Context, target string) error
}

// IsInline says whether a volume context is a CSI inline volume's.
func IsInline(volumeContext map[string]string) bool {
	return volumeContext[consts.ParamInlineContext] == "true"
}

// Open classifies a volume once and returns it. A recorded tree volume is a tree; a volume of
// ours (a record, or an ID naming a pool) is an image; otherwise a context naming a source is a
// static PV's tree, or, for an inline volume published read-only, the shared tree.
func (s *Service) Open(id string, volumeContext map[string]string, readOnly bool) Volume {
	if t, ok := s.store.GetTreeVolume(id); ok {
		return &treeVolume{s: s, id: id, rec: &t, inline: t.Inline}
	}
	inline := IsInline(volumeContext)
	if _, hasSource := volumeContext[consts.ParamSource]; hasSource {
		if _, ours := s.store.GetVolume(id); !ours {
			switch {
			case inline && readOnly:
				return &treeVolume{s: s, id: id, inline: true}
			case !inline && ids.PoolOfVolumeID(id) == "":
				return &treeVolume{s: s, id: id}
			}
		}
	}
	return &imageVolume{s: s, id: id}
}

// PoolPath returns the path of a configured pool, or FailedPrecondition when it is gone from the
// config (its volumes cannot be reached until it comes back).
func (s *Service) PoolPath(name string) (string, error) {
	p, ok := s.pools.Get(name)
	if !ok {
		return "", status.Errorf(codes.FailedPrecondition, "pool %q is not configured on node %s", name, s.nodeID)
	}
	return p.Path, nil
}

// ImagePath returns the image path of a volume.
func (s *Service) ImagePath(v state.Volume) (string, error) {
	path, err := s.PoolPath(v.Pool)
	if err != nil {
		return "", err
	}
	return image.VolumePath(path, pool.MetaDir, v.ID), nil
}

// Lookup finds a ready volume by ID. A node plugin that did not create the volume (separate
// controller and node instances over a shared pool) adopts it from its image.
func (s *Service) Lookup(id string) (state.Volume, error) {
	if v, ok := s.store.GetVolume(id); ok {
		if !v.Ready {
			return state.Volume{}, status.Errorf(codes.Aborted, "volume %s is still being created", id)
		}
		return v, nil
	}
	poolName := ids.PoolOfVolumeID(id)
	if poolName == "" {
		return state.Volume{}, status.Errorf(codes.NotFound, "volume %s does not exist", id)
	}
	path, err := s.PoolPath(poolName)
	if err != nil {
		return state.Volume{}, status.Errorf(codes.NotFound, "volume %s does not exist: %v", id, err)
	}
	size, err := s.images.Size(image.VolumePath(path, pool.MetaDir, id))
	if err != nil {
		return state.Volume{}, status.Errorf(codes.NotFound, "volume %s does not exist", id)
	}
	// Unknown history: Formatted makes staging probe the device before any mkfs.
	return state.Volume{ID: id, Pool: poolName, CapacityBytes: size, Ready: true, Formatted: true, NeedsGrow: true}, nil
}

// SelectPool picks the pool for a new volume. No room, or no allowed pool on this node, is
// ResourceExhausted so that external-provisioner retries or tries another node.
func (s *Service) SelectPool(pl params.Volume, size int64) (pool.Status, error) {
	pools, _ := s.pools.List()
	return s.selectFrom(pools, pl, size)
}

// selectInlinePool is SelectPool for an inline volume of size bytes, required of them free now:
// among the pools the administrator allows inline volumes, for no more than the largest inline
// size.
func (s *Service) selectInlinePool(pl params.Volume, size, required int64) (pool.Status, error) {
	if s.inline.MaxBytes > 0 && size > s.inline.MaxBytes {
		return pool.Status{}, status.Errorf(codes.OutOfRange, "an inline volume of %d bytes is larger than the %d bytes inline volumes may take on this node (--max-inline-volume-bytes)",
			size, s.inline.MaxBytes)
	}
	pools, _ := s.pools.List()
	if len(s.inline.Pools) == 0 {
		return s.selectFrom(pools, pl, required)
	}
	if pl.Pool != "" && !slices.Contains(s.inline.Pools, pl.Pool) {
		return pool.Status{}, status.Errorf(codes.PermissionDenied, "inline volumes may not use pool %q (the administrator allows %s with --inline-pools)",
			pl.Pool, strings.Join(s.inline.Pools, ", "))
	}
	allowed := pools[:0:0]
	for _, p := range pools {
		if slices.Contains(s.inline.Pools, p.Name) {
			allowed = append(allowed, p)
		}
	}
	return s.selectFrom(allowed, pl, required)
}

func (s *Service) selectFrom(pools []pool.Status, pl params.Volume, size int64) (pool.Status, error) {
	chosen, err := pool.Select(pools, pool.Request{Name: pl.Pool, Selector: pl.PoolSelector, RequiredBytes: size})
	if err != nil {
		var noRoom *pool.NoRoomError
		if errors.As(err, &noRoom) {
			return pool.Status{}, status.Errorf(codes.ResourceExhausted, "node %s: %v", s.nodeID, err)
		}
		return pool.Status{}, Internal("selecting a pool", err)
	}
	return chosen, nil
}

// Delete detaches and removes a volume's image, releases its dataset layer, then removes its
// record.
func (s *Service) Delete(v state.Volume) error {
	if img, err := s.ImagePath(v); err == nil {
		if dev, _ := s.images.Find(img); dev != "" {
			if err := s.images.Detach(dev); err != nil {
				return Internal("detaching loop device", err)
			}
		}
		if err := s.images.Remove(img); err != nil {
			return Internal("removing volume image", err)
		}
	}
	// A layered volume's reference goes with it; the cached version may then be evicted. So
	// does the streaming tree a crash may have left under it.
	if err := s.releaseStreamLower(context.Background(), v.ID); err != nil {
		return err
	}
	if err := s.releaseLayer(v.Pool, v.DatasetLayer, v.ID); err != nil {
		return Internal("releasing the volume's dataset layer", err)
	}
	if s.wb != nil {
		// What a claim's uploads put at the target (writeback.Uploader.Keep) goes with it.
		if err := s.wb.up.Forget(v.ID); err != nil {
			return Internal("removing the volume's write-back journal", err)
		}
		if err := s.wb.creds.Remove(v.ID); err != nil {
			return Internal("removing the volume's write-back credentials", err)
		}
	}
	if err := s.store.DeleteVolume(v.ID); err != nil {
		return Internal("removing volume state", err)
	}
	s.ready.forget(v.ID)
	s.staging.forget(v.ID)
	s.pools.UpdateCapacity(v.Pool)
	return nil
}

// Fits checks that a capability (block, or mount with a filesystem type) fits a volume.
func Fits(v state.Volume, block bool, fsType string) error {
	if block != (v.AccessType == state.Block) {
		return fmt.Errorf("volume %s is a %s volume", v.ID, v.AccessType)
	}
	if fsType != "" && v.FSType != "" && fsType != v.FSType {
		return fmt.Errorf("volume %s has filesystem %s, not %s", v.ID, v.FSType, fsType)
	}
	return nil
}

// ImageError maps a failed image operation: a full pool is ResourceExhausted, anything else
// Internal.
func (s *Service) ImageError(what, poolName string, err error) error {
	if errors.Is(err, unix.ENOSPC) {
		return status.Errorf(codes.ResourceExhausted, "%s: pool %q on node %s: %v", what, poolName, s.nodeID, err)
	}
	return Internal(what, err)
}

// Internal is the error for anything unexpected, wrapped once.
func Internal(what string, err error) error {
	return status.Errorf(codes.Internal, "%s: %v", what, err)
}
