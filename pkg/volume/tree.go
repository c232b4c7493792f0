package volume

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/pool"
	"github.com/cistern-csi/cistern/pkg/state"
	"github.com/cistern-csi/cistern/pkg/testpoint"
)

// treeVolume is a dataset's cached tree bind-mounted read-only, with no image: a static PV
// (staged, then published from the staging path) or a read-only inline volume (published
// straight from the tree). rec is its record once served.
type treeVolume struct {
	s      *Service
	id     string
	rec    *state.TreeVolume
	inline bool
	// layerOf is the writable volume this streaming tree is the lower layer of (streamlayer.go).
	layerOf string
}

func (tv *treeVolume) Kind() Kind { return KindTree }

// Stage serves a static PV's dataset at the staging path.
func (tv *treeVolume) Stage(ctx context.Context, r StageRequest) error {
	if tv.inline {
		return status.Errorf(codes.InvalidArgument, "inline volume %s is not staged", tv.id)
	}
	if r.Block {
		return status.Error(codes.InvalidArgument, "a dataset volume must be a mount volume")
	}
	pl, err := ParseParams(r.VolumeContext, params.StaticPV)
	if err != nil {
		return err
	}
	if pl.OutputTarget != "" && pl.Capacity == 0 {
		// Only a per-pod writable copy has changes to upload, and only a capacity makes one.
		return status.Errorf(codes.InvalidArgument, "static volume %s names %s but no %s: without one its publications are read-only, with nothing to upload", tv.id, consts.ParamOutputTarget, consts.ParamCapacity)
	}
	return tv.serve(ctx, r.Path, r.VolumeContext, r.Secrets, params.StaticPV)
}

// Unstage releases a static PV's dataset.
func (tv *treeVolume) Unstage(ctx context.Context, path string) error {
	tv.s.ready.forget(tv.id)
	tv.s.staging.forget(tv.id)
	if tv.rec == nil || tv.inline {
		return status.Errorf(codes.NotFound, "volume %s does not exist", tv.id)
	}
	return tv.release(ctx, path)
}

// Publish binds a static PV's staging path, or serves a read-only inline volume's dataset, at
// the target. A static PV with a capacity published writable, with a writer access mode, gets a
// per-pod writable copy of its staged dataset instead (publishCopy).
func (tv *treeVolume) Publish(ctx context.Context, r PublishRequest) error {
	if r.Block {
		return status.Error(codes.InvalidArgument, "a dataset volume must be a mount volume")
	}
	if tv.inline {
		if tv.rec != nil && tv.rec.Path == r.Target && tv.served() {
			return nil // a republish (republish.go)
		}
		return tv.serve(ctx, r.Target, r.VolumeContext, r.Secrets, params.Inline)
	}
	if tv.rec == nil {
		return status.Errorf(codes.NotFound, "volume %s does not exist", tv.id)
	}
	if !r.ReadOnly && !r.ReaderOnly {
		pl, err := ParseParams(tv.rec.Parameters, params.StaticPV)
		if err != nil {
			return err
		}
		if pl.Capacity > 0 {
			return tv.publishCopy(ctx, r, pl)
		}
	}
	source := tv.rec.Path // staged by an older version: a bind mount of the tree
	if tv.rec.Tree != "" {
		// The version this volume was served, where it is now: rec.Tree named the current
		// version's directory, which another version may hold by now.
		tree, err := tv.s.datasets.Served(tv.rec.Pool, tv.rec.DatasetID, tv.id)
		if err != nil {
			return status.Error(datasource.Code(err), err.Error())
		}
		source = tree
	}
	return tv.s.bindMount(source, r.Target, false, true, r.MountFlags)
}

// publishCopy gives one publication of a static PV its own writable volume of capacity bytes,
// in the pool that holds the staged dataset and filled from it: a local copy, never a second
// download. The copy is deleted with the publication. It is the inline volumes' ephemeral path;
// the dataset's credentials come with NodePublish (the PV's nodePublishSecretRef) because each
// caller proves it may read the cached version. A copy of a volume that names an output target
// is written back when the pod lets it go, as an inline volume is (writeback.go): the publishing
// pod's credentials must write the target, and the pod may be named in it.
func (tv *treeVolume) publishCopy(ctx context.Context, r PublishRequest, pl params.Volume) error {
	s := tv.s
	id := copyID(tv.id, r.Target)
	v, exists := s.store.GetVolume(id)
	if exists && s.inPlace(v.Published, r.Target) {
		return nil // a republish (republish.go)
	}
	if !exists {
		attrs := tv.rec.Parameters
		if pl.OutputTarget != "" {
			attrs = withPodInfo(attrs, r.VolumeContext)
			spec := datasource.SpecOf(pl.Dataset)
			spec.Tenant = tenantVolume(tv.id)
			if err := s.checkOutput(ctx, id, pl.OutputTarget, spec, r.Secrets, attrs); err != nil {
				return err
			}
		}
		pools, _ := s.pools.List()
		chosen, err := s.selectFrom(pools, params.Volume{Pool: tv.rec.Pool}, pl.Capacity)
		if err != nil {
			return err
		}
		v = state.Volume{ID: id, Name: id, Pool: chosen.Name, CapacityBytes: pl.Capacity, Parameters: attrs, CopyOf: tv.id}
		if err := s.createEphemeral(&v, chosen.Path, r.FSType); err != nil {
			return err
		}
	}
	return s.mountEphemeral(ctx, v, r)
}

// withPodInfo is a static volume's attributes with the publishing pod's name, namespace and UID
// from the publish context (kubelet's podInfoOnMount): its copy's output target may name the pod,
// and the write-back's Events go to it.
func withPodInfo(attrs, publishContext map[string]string) map[string]string {
	out := make(map[string]string, len(attrs)+3)
	for k, v := range attrs {
		out[k] = v
	}
	for _, k := range []string{consts.VolumeContextPodNamespace, consts.VolumeContextPodName, consts.VolumeContextPodUID} {
		if v, ok := publishContext[k]; ok {
			out[k] = v
		}
	}
	return out
}

// copyID names the writable copy of volume id published at target. Its suffix is not 32 hex
// digits, so it never reads as a volume ID naming a pool (PoolOfVolumeID).
func copyID(id, target string) string {
	sum := sha256.Sum256([]byte(target))
	return id + "-copy-" + hex.EncodeToString(sum[:12])
}

// Unpublish unmounts the target; a read-only inline volume releases its dataset with it, and a
// writable copy of a static PV is deleted.
func (tv *treeVolume) Unpublish(ctx context.Context, target string) error {
	tv.s.ready.forget(tv.id)
	tv.s.staging.forget(tv.id)
	if tv.inline && tv.rec != nil {
		return tv.release(ctx, target)
	}
	if !tv.inline {
		return (&imageVolume{s: tv.s, id: copyID(tv.id, target)}).Unpublish(ctx, target)
	}
	if err := unmountTarget(tv.s.mounter, target); err != nil {
		return Internal("unmounting target path", err)
	}
	return nil
}

// serve stages the dataset on a pool chosen by the attributes, references it for the volume and
// bind-mounts the cached tree read-only at path.
func (tv *treeVolume) serve(ctx context.Context, path string, attrs, secrets map[string]string, use params.Use) error {
	s := tv.s
	pl, spec, capacity, err := tv.dataset(attrs, use)
	if err != nil {
		return err
	}
	poolName := ""
	if tv.rec != nil {
		poolName = tv.rec.Pool // stay where the first attempt staged
	} else {
		var chosen pool.Status
		var err error
		if tv.inline {
			// Room is checked when the dataset's size is known (staging), not against the limit.
			chosen, err = s.selectInlinePool(pl, capacity, 0)
		} else {
			pools, _ := s.pools.List()
			chosen, err = pool.Select(pools, pool.Request{Name: pl.Pool, Selector: pl.PoolSelector})
			if err != nil {
				err = status.Errorf(codes.ResourceExhausted, "node %s: %v", s.nodeID, err)
			}
		}
		if err != nil {
			return err
		}
		poolName = chosen.Name
	}
	rec := state.TreeVolume{ID: tv.id, Pool: poolName, DatasetID: spec.ID(), Parameters: recordedAttrs(attrs), Path: path, Inline: tv.inline}
	served, version, err := tv.awaitOrStream(ctx, rec, spec, capacity, secrets, attrs, pl.Streaming)
	if err != nil || served {
		return err
	}
	// Reference first: from here eviction leaves the tree alone, even across a restart.
	if err := s.store.PutTreeVolume(rec); err != nil {
		return Internal("saving dataset volume state", err)
	}
	tv.rec = &rec
	testpoint.Reach(testpoint.TreeReferenced, tv.id)
	tree, err := s.datasets.Serve(poolName, spec, version, tv.id)
	if err != nil {
		return status.Error(datasource.Code(err), err.Error())
	}
	testpoint.Reach(testpoint.TreeServed, tv.id)
	if !tv.inline {
		// A static PV's publications bind the tree itself; see state.TreeVolume.Tree.
		rec.Tree = tree
		if err := s.store.PutTreeVolume(rec); err != nil {
			return Internal("saving dataset volume state", err)
		}
		if err := os.MkdirAll(path, 0o750); err != nil {
			return Internal("creating staging path", err)
		}
		s.ready.ready(tv.id, readyTree)
		klog.FromContext(ctx).V(4).Info("Staged cached dataset", "volumeID", tv.id, "dataset", spec.String(), "tree", tree)
		return nil
	}
	if err := s.bindMount(tree, path, false, true, nil); err != nil {
		return err
	}
	testpoint.Reach(testpoint.TreeMounted, tv.id)
	s.ready.ready(tv.id, readyTree)
	klog.FromContext(ctx).V(4).Info("Serving cached dataset read-only", "volumeID", tv.id, "dataset", spec.String(), "path", path)
	return nil
}

// dataset reads the volume's parameters: its dataset, and the most that dataset may take.
func (tv *treeVolume) dataset(attrs map[string]string, use params.Use) (params.Volume, *datasource.Spec, int64, error) {
	pl, err := ParseParams(attrs, use)
	if err != nil {
		return pl, nil, 0, err
	}
	spec := datasource.SpecOf(pl.Dataset)
	if spec == nil {
		return pl, nil, 0, status.Errorf(codes.InvalidArgument, "volume %s names no %s", tv.id, consts.ParamSource)
	}
	// A pod author's (inline) or a namespace user's (VolumeManager) dataset: docs/security.md.
	spec.Tenant = tv.inline || tenantVolume(tv.id)
	spec.Namespace = callerNamespace(attrs, tv.inline)
	// A read-only inline volume's dataset is held to its size like a writable one's: the size
	// it names, or the largest an inline volume may take.
	capacity := pl.Capacity // a static PV's: the VolumeManager's capacity
	if tv.inline {
		capacity = pl.Size
		if capacity == 0 {
			capacity = tv.s.inline.MaxBytes
		}
	}
	return pl, spec, capacity, nil
}

// awaitOrStream waits for the volume's dataset and returns the version the caller proved it
// reads; a streaming volume is served at once instead (served), unless its dataset is staged
// already or this node cannot stream: then it is staged as any other.
func (tv *treeVolume) awaitOrStream(ctx context.Context, rec state.TreeVolume, spec *datasource.Spec, capacity int64, secrets, attrs map[string]string, streaming bool) (served bool, version string, err error) {
	if tv.rec == nil { // a first attempt; a staged volume's repeated stage is not timed
		tv.s.ready.start(tv.id)
	}
	if streaming {
		if served, version, err = tv.serveStreaming(ctx, rec, spec, capacity, secrets, attrs); err != nil || served || version != "" {
			if served {
				tv.s.ready.ready(tv.id, readyStream)
			}
			return served, version, err
		}
	}
	var w *stagingWatch // a static PV's claim is named by no record the driver trusts
	if tv.inline {
		w = podWatch(tv.id, attrs)
	}
	version, err = tv.s.awaitDataset(ctx, spec, rec.Pool, capacity, secrets, attrs, w)
	return false, version, err
}

// release unmounts the volume's path and drops its reference and record.
func (tv *treeVolume) release(ctx context.Context, path string) error {
	s, t := tv.s, tv.rec
	s.ready.forget(t.ID)
	s.staging.forget(t.ID)
	if err := s.streams.stop(t.ID); err != nil {
		return Internal("unmounting streaming dataset", err)
	}
	if err := mount.CleanupMountPoint(path, s.mounter, true); err != nil {
		return Internal("unmounting dataset", err)
	}
	testpoint.Reach(testpoint.TreeUnmounted, t.ID)
	if err := s.datasets.Unserve(t.Pool, t.DatasetID, t.ID); err != nil {
		return Internal("releasing dataset", err)
	}
	testpoint.Reach(testpoint.TreeUnserved, t.ID)
	if err := s.store.DeleteTreeVolume(t.ID); err != nil {
		return Internal("removing dataset volume state", err)
	}
	klog.FromContext(ctx).V(4).Info("Released cached dataset", "volumeID", t.ID)
	return nil
}

// tenantVolume says whether a static PV was written by the VolumeManager controller for a
// namespace user rather than by an administrator.
func tenantVolume(volumeID string) bool {
	return strings.HasPrefix(volumeID, consts.VolumeManagerHandlePrefix)
}
