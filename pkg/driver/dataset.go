package driver

// Dataset volumes (issue 3): volumes pre-filled from S3, NFS or node-local sources through
// pkg/datasource. This file holds the driver's side of it; the RPC handlers call in at a few
// clearly marked points:
//
//   - CreateVolume validates the dataset parameters and, when the driver runs on the node
//     (--mode all), starts staging at once so the data is usually there before the pod.
//   - NodeStageVolume of a volume with an image waits (within its deadline) for the dataset and
//     copies it into the freshly formatted filesystem, once.
//   - A static PV without an image (volumeAttributes with a source) and a read-only inline
//     volume share the node's cached tree with a read-only bind mount: zero copy.
//   - A writable inline volume gets its own copy, like a dynamic one.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/pool"
	"github.com/cistern-csi/cistern/pkg/state"
)

// initDatasets creates the node's dataset manager over the configured pools.
func (d *Driver) initDatasets(reg *prometheus.Registry) error {
	cfg := d.cfg.Datasets
	pools, _ := d.pools.List()
	for _, p := range pools {
		cfg.Pools = append(cfg.Pools, p.Path)
	}
	m, err := datasource.NewManager(cfg)
	if err != nil {
		return err
	}
	d.datasets = m
	reg.MustRegister(m.Collector())
	return nil
}

// datasetSpec returns the dataset a volume's parameters ask for, or nil. Only dataset keys are
// looked at: the other keys are parsePlacement's to check. An inline volume's dataset is a
// tenant's (docs/security.md).
func datasetSpec(params map[string]string, ephemeral bool) (*datasource.Spec, error) {
	ds := map[string]string{}
	for k, v := range params {
		if datasource.IsParam(k) {
			ds[k] = v
		}
	}
	spec, err := datasource.ParseParams(ds, ephemeral)
	if err != nil {
		return nil, status.Error(datasource.Code(err), err.Error())
	}
	if spec != nil {
		spec.Tenant = ephemeral
	}
	return spec, nil
}

// tenantVolume says whether a static PV was written by the VolumeManager controller for a
// namespace user rather than by an administrator.
func tenantVolume(volumeID string) bool {
	return strings.HasPrefix(volumeID, consts.VolumeManagerHandlePrefix)
}

// checkDatasetCreate validates a CreateVolume's dataset parameters. A volume is filled from a
// dataset or from a snapshot or clone, never both: filling a restored volume from a dataset
// would overwrite (or, for a dataset that shrank, delete) restored files.
func checkDatasetCreate(params map[string]string, shape volumeShape, content *csi.VolumeContentSource) (*datasource.Spec, error) {
	spec, err := datasetSpec(params, false)
	if err != nil || spec == nil {
		return nil, err
	}
	if shape.access == state.Block {
		return nil, status.Error(codes.InvalidArgument, "a dataset source needs a mount volume, not a block volume")
	}
	if content.GetSnapshot() != nil || content.GetVolume() != nil {
		return nil, status.Errorf(codes.InvalidArgument, "parameter %q and a snapshot or volume content source exclude each other", consts.ParamSource)
	}
	return spec, nil
}

// usableBytes is what a dataset may take of a volume: the filesystem keeps some for itself.
func usableBytes(capacity int64) int64 { return capacity - capacity/20 }

// prestageDataset starts staging at CreateVolume when this process is also the node plugin
// (--mode all), so the data is usually in place before the pod, and waits, within the RPC's
// budget, for the dataset's listing: a dataset that cannot fit the requested capacity is refused
// with OutOfRange before the volume is created (the code the CSI spec gives a volume smaller than
// its source snapshot: the request, not the node, must change; ResourceExhausted would have the
// provisioner retry the same size). Other failures are logged and surface again at
// NodeStageVolume, as does a listing that outlasts the budget (staging goes on).
//
// An S3 dataset without CreateVolume secrets is not pre-staged: a class that passes its
// credentials only to NodeStageVolume (csi.storage.k8s.io/node-stage-secret-*) would otherwise
// stage anonymously, fail with access denied, and NodeStageVolume would get that cached permanent
// failure even though it brings the right credentials.
func (d *Driver) prestageDataset(ctx context.Context, name, poolPath string, size int64, spec *datasource.Spec, secrets map[string]string) error {
	if spec == nil || d.cfg.Mode != ModeAll || spec.Scheme == datasource.SchemeS3 && len(secrets) == 0 {
		return nil
	}
	logger := klog.FromContext(ctx).WithValues("name", name, "dataset", spec.String())
	creds, err := datasource.CredentialsFromSecrets(secrets)
	if err != nil {
		logger.Error(err, "Not pre-staging dataset")
		return nil
	}
	lctx, cancel := listBudget(ctx)
	defer cancel()
	st, err := d.datasets.Listed(lctx, datasource.Request{Spec: spec, Creds: creds, Pool: poolPath, Capacity: usableBytes(size)})
	switch {
	case datasource.Code(err) == codes.OutOfRange:
		return status.Errorf(codes.OutOfRange, "%v; requested capacity %d bytes: request a larger volume", err, size)
	case err != nil:
		logger.Error(err, "Pre-staging dataset failed")
	default:
		logger.V(2).Info("Pre-staging dataset", "status", st.String())
	}
	return nil
}

// listBudget is how long CreateVolume waits for a dataset's listing: until shortly before its
// deadline (a minute without one).
func listBudget(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok {
		return context.WithDeadline(ctx, dl.Add(-3*time.Second))
	}
	return context.WithTimeout(ctx, time.Minute)
}

// waitBudget is how long an RPC may wait for staging: until shortly before its deadline.
func waitBudget(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok {
		return context.WithDeadline(ctx, dl.Add(-3*time.Second))
	}
	return context.WithTimeout(ctx, 30*time.Second)
}

// awaitDataset waits for the dataset of a volume to be staged on its pool and for the caller to
// prove, with the secrets it brings, that it may read it. It returns the version proved,
// Unavailable with the progress while staging goes on (kubelet retries), and the staging error
// with its own code when staging failed.
func (d *Driver) awaitDataset(ctx context.Context, spec *datasource.Spec, poolName string, capacity int64, secrets map[string]string) (string, error) {
	if err := d.datasets.CheckEndpoint(spec); err != nil {
		return "", status.Error(datasource.Code(err), err.Error())
	}
	creds, err := datasource.CredentialsFromSecrets(secrets)
	if err != nil {
		return "", status.Error(datasource.Code(err), err.Error())
	}
	poolPath, err := d.poolPath(poolName)
	if err != nil {
		return "", err
	}
	wctx, cancel := waitBudget(ctx)
	defer cancel()
	st, err := d.datasets.Wait(wctx, datasource.Request{Spec: spec, Creds: creds, Pool: poolPath, Capacity: capacity})
	if err != nil {
		return "", status.Error(datasource.Code(err), err.Error())
	}
	if !st.Ready() {
		return "", status.Errorf(codes.Unavailable, "%s; retry later", st)
	}
	return st.Version, nil
}

// volumeDataset returns the dataset of an image-backed volume, from its CreateVolume parameters
// or, for a volume the driver adopted, from the volume context.
func volumeDataset(v state.Volume, volumeContext map[string]string) (*datasource.Spec, error) {
	params := v.Parameters
	if len(params) == 0 {
		params = volumeContext
	}
	return datasetSpec(params, v.Ephemeral)
}

// populateDataset copies the staged dataset version the caller proved it may read into a
// volume's new filesystem; a volume already populated is left alone (its data is the user's now).
func (d *Driver) populateDataset(ctx context.Context, spec *datasource.Spec, version, poolName, target string) error {
	poolPath, err := d.poolPath(poolName)
	if err != nil {
		return err
	}
	if err := d.datasets.Populate(ctx, poolPath, spec, version, target); err != nil {
		return status.Errorf(datasource.Code(err), "filling volume from %s: %v", spec, err)
	}
	return nil
}

// datasetHealth reports a dataset still staging, or failed, as the volume's condition.
func (d *Driver) datasetHealth(v state.Volume) []*csi.VolumeHealth_VolumeHealthEntry {
	spec, err := datasetSpec(v.Parameters, v.Ephemeral)
	if err != nil || spec == nil {
		return nil
	}
	p, ok := d.pools.Get(v.Pool)
	if !ok {
		return nil
	}
	// Failures are told to the caller whose attempt failed (NodeStageVolume's error), not here.
	if st, known, err := d.datasets.Status(p.Path, spec); err == nil && known && !st.Ready() {
		return []*csi.VolumeHealth_VolumeHealthEntry{{Status: csi.VolumeHealthErrorType_INACCESSIBLE,
			Reason: "DatasetStaging", Message: st.String()}}
	}
	return nil
}

// treeVolume records a volume served from the node's cached tree (no image): a static PV
// staged with a read-only bind mount, or a read-only inline volume published with one.
type treeVolume struct {
	VolumeID  string            `json:"volumeID"`
	Pool      string            `json:"pool"`
	PoolPath  string            `json:"poolPath"`
	DatasetID string            `json:"datasetID"`
	Params    map[string]string `json:"params"`
	// Path is the staging path (static PV) or the target path (inline volume).
	Path      string `json:"path"`
	Ephemeral bool   `json:"ephemeral,omitempty"`
}

func (d *Driver) treeRecordPath(volumeID string) string {
	sum := sha256.Sum256([]byte(volumeID))
	return filepath.Join(d.cfg.StateDir, "dataset-volumes", hex.EncodeToString(sum[:16])+".json")
}

func (d *Driver) getTreeVolume(volumeID string) (treeVolume, bool) {
	b, err := os.ReadFile(d.treeRecordPath(volumeID))
	if err != nil {
		return treeVolume{}, false
	}
	var t treeVolume
	if json.Unmarshal(b, &t) != nil || t.VolumeID != volumeID {
		return treeVolume{}, false
	}
	return t, true
}

func (d *Driver) putTreeVolume(t treeVolume) error {
	p := d.treeRecordPath(t.VolumeID)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	return state.WriteFile(p, b)
}

func (d *Driver) deleteTreeVolume(volumeID string) error {
	err := os.Remove(d.treeRecordPath(volumeID))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// isTreeStage says whether NodeStageVolume is for a static dataset PV: a source in the volume
// context and no volume of the driver's own behind the ID.
func (d *Driver) isTreeStage(id string, volumeContext map[string]string) bool {
	if _, ok := volumeContext[consts.ParamSource]; !ok {
		return false
	}
	if _, ok := d.store.GetVolume(id); ok {
		return false
	}
	return poolOfVolumeID(id) == ""
}

func readOnlyMode(c *csi.VolumeCapability) bool {
	switch c.GetAccessMode().GetMode() {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY, csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:
		return true
	}
	return false
}

// serveTree stages the dataset on a pool chosen by the parameters, references it for volumeID
// and bind-mounts the cached tree read-only at path.
func (d *Driver) serveTree(ctx context.Context, volumeID, path string, params, secrets map[string]string, ephemeral bool) error {
	spec, err := datasetSpec(params, ephemeral)
	if err != nil {
		return err
	}
	spec.Tenant = spec.Tenant || tenantVolume(volumeID)
	pl, err := parsePlacement(params)
	if err != nil {
		return err
	}
	pools, _ := d.pools.List()
	chosen, err := pool.Select(pools, pool.Request{Name: pl.pool, Selector: pl.selector})
	if err != nil {
		return status.Errorf(codes.ResourceExhausted, "node %s: %v", d.cfg.NodeID, err)
	}
	if t, ok := d.getTreeVolume(volumeID); ok {
		chosen.Name, chosen.Path = t.Pool, t.PoolPath // stay where the first attempt staged
	}
	version, err := d.awaitDataset(ctx, spec, chosen.Name, 0, secrets)
	if err != nil {
		return err
	}
	t := treeVolume{VolumeID: volumeID, Pool: chosen.Name, PoolPath: chosen.Path, DatasetID: spec.ID(),
		Params: params, Path: path, Ephemeral: ephemeral}
	// Reference first: from here eviction leaves the tree alone, even across a restart.
	if err := d.putTreeVolume(t); err != nil {
		return internal("saving dataset volume state", err)
	}
	tree, err := d.datasets.Acquire(chosen.Path, spec, version, volumeID)
	if err != nil {
		return status.Error(datasource.Code(err), err.Error())
	}
	if err := d.bindMount(tree, path, false, true, nil); err != nil {
		return err
	}
	klog.FromContext(ctx).V(4).Info("Serving cached dataset read-only", "volumeID", volumeID, "dataset", spec.String(), "path", path)
	return nil
}

// releaseTree unmounts a tree volume's path and drops its reference.
func (d *Driver) releaseTree(ctx context.Context, t treeVolume, path string) error {
	if err := mount.CleanupMountPoint(path, d.mounter, true); err != nil {
		return internal("unmounting dataset", err)
	}
	if err := d.datasets.ReleaseID(t.PoolPath, t.DatasetID, t.VolumeID); err != nil {
		return internal("releasing dataset", err)
	}
	if err := d.deleteTreeVolume(t.VolumeID); err != nil {
		return internal("removing dataset volume state", err)
	}
	klog.FromContext(ctx).V(4).Info("Released cached dataset", "volumeID", t.VolumeID)
	return nil
}

// stageTree handles NodeStageVolume of a static dataset PV. handled is false for every other
// volume.
func (d *Driver) stageTree(ctx context.Context, req *csi.NodeStageVolumeRequest) (handled bool, err error) {
	id := req.GetVolumeId()
	if !d.isTreeStage(id, req.GetVolumeContext()) {
		return false, nil
	}
	if req.GetVolumeCapability().GetBlock() != nil {
		return true, status.Error(codes.InvalidArgument, "a dataset volume must be a mount volume")
	}
	release, err := d.locks.acquire(volumeKey(id))
	if err != nil {
		return true, err
	}
	defer release()
	return true, d.serveTree(ctx, id, req.GetStagingTargetPath(), req.GetVolumeContext(), req.GetSecrets(), false)
}

// unstageTree handles NodeUnstageVolume of a static dataset PV.
func (d *Driver) unstageTree(ctx context.Context, id, path string) (handled bool, err error) {
	t, ok := d.getTreeVolume(id)
	if !ok || t.Ephemeral {
		return false, nil
	}
	release, err := d.locks.acquire(volumeKey(id))
	if err != nil {
		return true, err
	}
	defer release()
	return true, d.releaseTree(ctx, t, path)
}

// publishTree handles NodePublishVolume of a static dataset PV (bind the staging path) and of a
// read-only inline dataset volume (bind the cached tree).
func (d *Driver) publishTree(ctx context.Context, req *csi.NodePublishVolumeRequest) (handled bool, err error) {
	id := req.GetVolumeId()
	if t, ok := d.getTreeVolume(id); ok && !t.Ephemeral {
		if req.GetVolumeCapability().GetBlock() != nil {
			return true, status.Error(codes.InvalidArgument, "a dataset volume must be a mount volume")
		}
		return true, d.bindMount(t.Path, req.GetTargetPath(), false, true, req.GetVolumeCapability().GetMount().GetMountFlags())
	}
	if !isEphemeral(req.GetVolumeContext()) || !req.GetReadonly() {
		return false, nil
	}
	if _, ok := req.GetVolumeContext()[consts.ParamSource]; !ok {
		return false, nil
	}
	attrs := map[string]string{}
	for k, v := range req.GetVolumeContext() {
		if k != ParamSize {
			attrs[k] = v
		}
	}
	release, err := d.locks.acquire(volumeKey(id))
	if err != nil {
		return true, err
	}
	defer release()
	return true, d.serveTree(ctx, id, req.GetTargetPath(), attrs, req.GetSecrets(), true)
}

// unpublishTree handles NodeUnpublishVolume of a read-only inline dataset volume.
func (d *Driver) unpublishTree(ctx context.Context, id, target string) (handled bool, err error) {
	t, ok := d.getTreeVolume(id)
	if !ok || !t.Ephemeral {
		return false, nil
	}
	release, err := d.locks.acquire(volumeKey(id))
	if err != nil {
		return true, err
	}
	defer release()
	return true, d.releaseTree(ctx, t, target)
}

// fillDataset fills a freshly mounted volume from its dataset, once: it waits for staging within
// the RPC's deadline (Unavailable with the progress otherwise) and copies the cached tree in.
func (d *Driver) fillDataset(ctx context.Context, v state.Volume, volumeContext, secrets map[string]string, target string) error {
	spec, err := volumeDataset(v, volumeContext)
	if err != nil || spec == nil {
		return err
	}
	if datasource.Populated(target, spec) {
		return nil
	}
	version, err := d.awaitDataset(ctx, spec, v.Pool, usableBytes(v.CapacityBytes), secrets)
	if err != nil {
		return err
	}
	return d.populateDataset(ctx, spec, version, v.Pool, target)
}
