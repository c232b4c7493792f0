package volume

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/state"
	"github.com/cistern-csi/cistern/pkg/writeback"
	"github.com/cistern-csi/cistern/pkg/writeback/credstore"
)

// WriteBack configures the write-back of writable dataset volumes that name an output target
// (docs/datasets.md, "Write-back"). Inline volumes only, so far.
type WriteBack struct {
	// Dir holds the journals of the uploads and the credentials they use (sealed,
	// pkg/writeback/credstore), on storage that outlives the node plugin (--writeback-dir).
	// Empty: output targets are refused.
	Dir string
	// MaxPendingBytes bounds what the node holds that is not uploaded yet: a volume that names an
	// output target is refused at publish while the node holds this much (0: no bound). Each
	// namespace's uploads count up to its share (writeback_budget.go).
	MaxPendingBytes int64
	// MaxPendingBytesPerNamespace is a namespace's share of MaxPendingBytes: its volumes naming
	// an output target are refused while it holds this much, and what it holds past it does not
	// count against the node (--writeback-max-pending-bytes-per-namespace; 0: a quarter of
	// MaxPendingBytes).
	MaxPendingBytesPerNamespace int64
	// MaxAge is how long an upload may stay pending after its hand-off; then it expires
	// (writeback_expiry.go): its credentials are deleted and so is an inline volume's data, a
	// claim keeps its own (--writeback-max-age; 0: never).
	MaxAge time.Duration
	// MinInterval is the shortest outputInterval (checkpoints) a volume may name
	// (--writeback-min-interval).
	MinInterval time.Duration
	// Uploader tunes the uploads (its Dir is Dir's journals); zero values take the defaults.
	Uploader writeback.Config
	// OnProgress, when set, is told of each upload's progress and failures.
	OnProgress func(writeback.Progress)
	// OnEvent, when set, records Events on the pod or claim whose outputs they are
	// (writeback_events.go).
	OnEvent func(Event)
}

// writeBacks runs the node's uploads: one goroutine per volume handed off at unpublish, for as
// long as the node plugin runs; a restarted one resumes them from their journals (Recover).
type writeBacks struct {
	cfg WriteBack
	up  *writeback.Uploader
	// creds keeps the credentials of the uploads to S3 targets, sealed (writeback_creds.go).
	creds *credstore.Store

	// ctx ends the uploads when the node plugin stops (StopWriteBacks); wg waits for them.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	pending map[string]int64 // volume -> bytes not at the target yet
	// namespace is whose outputs each upload holds (writeback_budget.go); expired counts the
	// uploads that expired (metrics).
	namespace map[string]string
	expired   int64
	running   map[string]bool // volumes with an upload goroutine
	locks     map[string]*volumeLock
	// live are the checkpoints of volumes in use (checkpoint.go); checkpointing lets one run
	// at a time.
	live          map[string]*liveVolume
	checkpointing chan struct{}
	// refusals counts failed passes and checkpoints the checkpoints taken (metrics); node
	// labels the metrics.
	refusals, checkpoints int64
	// unconfirmed counts the uploads stopped because the target confirmed neither a checksum
	// nor an MD5 (metrics).
	unconfirmed int64
	node        string
	// failing are the uploads whose last pass failed; gen and changed are OutputsGeneration's
	// (writeback_report.go).
	failing map[string]bool
	gen     uint64
	changed chan struct{}
}

// handOffDelay is how long an upload waits after its hand-off: its first pass (16 requests
// reading and checksumming the outputs) would otherwise take the node plugin's CPU while the
// RPC's answer is still on its way. On 2 busy cores that added up to 12 ms to a NodeUnpublish
// whose own steps took 2 ms, with 2 GiB to upload (TestBenchUnpublish, as seen by its client).
const handOffDelay = time.Second

// start runs job's upload, after delay, unless it runs already (a repeated NodeUnpublish).
func (w *writeBacks) start(s *Service, job writeback.Job, delay time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running[job.Volume] {
		return
	}
	w.running[job.Volume] = true
	if v, ok := s.store.GetVolume(job.Volume); ok {
		w.namespace[job.Volume] = namespaceOf(v.Parameters)
		if _, known := w.pending[job.Volume]; !known {
			w.pending[job.Volume] = v.CapacityBytes // at most; the upload's first pass tells
		}
	}
	w.outputsChanged()
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		select {
		case <-w.ctx.Done():
		case <-time.After(delay):
			s.upload(job.Volume, job)
		}
		w.mu.Lock()
		delete(w.running, job.Volume)
		w.mu.Unlock()
	}()
}

func newWriteBacks(cfg WriteBack) *writeBacks {
	if cfg.Dir == "" {
		return nil
	}
	cfg.Uploader.Dir = filepath.Join(cfg.Dir, "journals")
	up, err := writeback.New(cfg.Uploader)
	if err != nil {
		klog.Background().Error(err, "Write-back disabled")
		return nil
	}
	creds, err := openCreds(cfg.Dir)
	if err != nil {
		klog.Background().Error(err, "Write-back disabled")
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &writeBacks{cfg: cfg, up: up, creds: creds, ctx: ctx, cancel: cancel, pending: map[string]int64{}, namespace: map[string]string{},
		running: map[string]bool{}, locks: map[string]*volumeLock{}, live: map[string]*liveVolume{}, checkpointing: make(chan struct{}, 1),
		failing: map[string]bool{}, changed: make(chan struct{})}
}

// checkOutput is the publish-time check of a volume that names an output target: the node has
// room for more unuploaded data, and the caller's own credentials may write the target (a
// probe object written and deleted), so that a tenant who may read the dataset but not write
// the target is refused before its pod starts. It returns the credentials to keep for the
// upload.
func (s *Service) checkOutput(ctx context.Context, id, raw string, spec *datasource.Spec, secrets, volumeContext map[string]string) error {
	if s.wb == nil {
		return status.Errorf(codes.InvalidArgument, "%s: write-back is not enabled on node %s (--writeback-dir)", consts.ParamOutputTarget, s.nodeID)
	}
	// The ID names the upload's journal, mount point and kept credentials.
	if id == "." || id == ".." || strings.ContainsAny(id, "/\x00") {
		return status.Errorf(codes.InvalidArgument, "volume ID %q cannot name a write-back", id)
	}
	if s.writable.Copy {
		// A copy has no record of what the pods changed: nothing could tell the outputs.
		return status.Errorf(codes.InvalidArgument, "%s needs writable volumes layered on their dataset; node %s copies them (--writable-datasets=copy)", consts.ParamOutputTarget, s.nodeID)
	}
	if err := s.checkInterval(volumeContext); err != nil {
		return err
	}
	if err := s.wb.admit(s.nodeID, namespaceOf(volumeContext)); err != nil {
		return err
	}
	t, err := outputTarget(raw, volumeContext, tenantOutput(spec))
	if err != nil {
		return err
	}
	if t.NFS() {
		return s.checkNFSOutput(ctx, id, t, spec, volumeContext)
	}
	if spec.Credentials == consts.CredentialsWebIdentity {
		return status.Errorf(codes.InvalidArgument, "%s needs credentials from a secret: a web identity's token expires with the pod, before its outputs are uploaded", consts.ParamOutputTarget)
	}
	if err := s.probeS3(ctx, id, t, spec, secrets, volumeContext); err != nil {
		return err
	}
	return s.wb.saveSecrets(id, secrets)
}

// probeS3 writes and deletes a probe object under t with secrets: PermissionDenied when they may
// not write there.
func (s *Service) probeS3(ctx context.Context, id string, t writeback.Target, spec *datasource.Spec, secrets, volumeContext map[string]string) error {
	client, err := s.outputClient(ctx, spec, secrets, volumeContext, t.Bucket)
	if err != nil {
		return err
	}
	key := aws.String(t.Prefix + ".cistern-write-probe-" + id)
	_, err = client.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(t.Bucket), Key: key, Body: bytes.NewReader(nil)})
	if err != nil {
		s.wb.emit(volumeContext, true, ReasonOutputTargetRefused, "Volume %s: its credentials may not write its %s %s, so the pod does not start: %v",
			id, consts.ParamOutputTarget, t, err)
		return status.Errorf(codes.PermissionDenied, "the volume's credentials may not write its %s %s: %v", consts.ParamOutputTarget, t, err)
	}
	// Writing is what the upload needs; a tenant allowed to write but not delete keeps the probe.
	if _, err := client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(t.Bucket), Key: key}); err != nil {
		klog.FromContext(ctx).Info("Could not delete the write probe", "volumeID", id, "key", *key, "err", err.Error())
	}
	return nil
}

// checkNFSOutput is checkOutput's for an NFS target: the server is one the volume may name, and
// the node's NFS identity may create and remove a probe file in the target directory.
func (s *Service) checkNFSOutput(ctx context.Context, id string, t writeback.Target, spec *datasource.Spec, volumeContext map[string]string) error {
	uid, gid, err := s.datasets.OutputNFS(spec, t.Host)
	if err == nil {
		err = writeback.ProbeNFS(t, uid, gid, ".cistern-write-probe-"+id)
	}
	if err != nil {
		s.wb.emit(volumeContext, true, ReasonOutputTargetRefused, "Volume %s: the node may not write its %s %s, so the pod does not start: %v",
			id, consts.ParamOutputTarget, t, err)
		return status.Errorf(codes.PermissionDenied, "the node may not write the volume's %s %s: %v", consts.ParamOutputTarget, t, err)
	}
	klog.FromContext(ctx).V(4).Info("NFS output target writable", "volumeID", id, "target", t.String())
	return nil
}

// uploadInputs is what an upload or a checkpoint of v's outputs reads with besides the volume's
// filesystem: the S3 client (uploadClient) and, into job.Lower, what a renamed, deleted or
// replaced dataset file or directory held (the dataset version the volume references).
func (s *Service) uploadInputs(ctx context.Context, v state.Volume, job *writeback.Job) (*s3.Client, error) {
	spec, err := recordedDataset(v)
	if err != nil || spec == nil {
		return nil, fmt.Errorf("the volume's dataset: %v", err)
	}
	client, err := s.uploadClient(ctx, v, spec, job.Target)
	if err != nil {
		return nil, err
	}
	if job.Lower, err = s.layerTree(v); err != nil {
		return nil, fmt.Errorf("the volume's dataset layer: %w", err)
	}
	return client, nil
}

// uploadClient is the S3 client of a volume's upload, with the credentials kept for it; nil for
// an NFS target (written as the node's NFS identity).
func (s *Service) uploadClient(ctx context.Context, v state.Volume, spec *datasource.Spec, t writeback.Target) (*s3.Client, error) {
	if t.NFS() {
		return nil, nil
	}
	secrets, err := s.wb.loadSecrets(v.ID)
	if err != nil {
		return nil, err
	}
	// Static keys only (web-identity volumes take no S3 target): no token to bound by a deadline.
	return s.outputClient(ctx, spec, secrets, v.Parameters, t.Bucket)
}

func (s *Service) outputClient(ctx context.Context, spec *datasource.Spec, secrets, volumeContext map[string]string, bucket string) (*s3.Client, error) {
	creds, err := s.datasets.Credentials(ctx, spec, secrets, volumeContext)
	if err != nil {
		return nil, status.Error(datasource.Code(err), err.Error())
	}
	c, err := s.datasets.OutputClient(spec, creds, bucket)
	if err != nil {
		return nil, status.Error(datasource.Code(err), err.Error())
	}
	return c, nil
}

// handsOff says whether letting v go hands it to a write-back: a layered volume that names an
// output target, on a node with write-back on.
func (s *Service) handsOff(v state.Volume) bool {
	return v.Parameters[consts.ParamOutputTarget] != "" && s.wb != nil && v.DatasetLayer != ""
}

// handOff lets go of a volume that handsOff (an inline volume at NodeUnpublish, a claim at
// NodeUnstage, mounted at path) and starts the upload of its outputs: an inline volume (image,
// record, dataset layer) stays until every change is at the target, then goes; a claim may be
// neither staged nor deleted until then. The RPC returns at once, in about the time of a volume
// with nothing written:
//
//  1. the volume's filesystem is mounted aside (keepAside), read-only, before path is unmounted:
//     the same superblock, no I/O. The mounts at path are then not its last, so unmounting them
//     does not tear the filesystem down; that teardown (evicting what it holds in the page
//     cache: 125-147 ms with 2 GiB written, 1-2 ms empty) and the loop device's detach happen
//     after the upload, which reads through this mount;
//  2. path is unmounted: the overlay's unmount syncs the volume's filesystem, so what the pod
//     left dirty is on the volume's disk before the RPC returns, as without write-back;
//  3. the job is recorded durably (its journal): a crash after here resumes the upload
//     (Recover), which reuses the mount aside or, after a reboot, attaches and mounts again; a
//     crash before here leaves the volume published, and kubelet's retry goes on;
//  4. the record says it is let go (a node-side write: the journal is the commit point).
func (s *Service) handOff(ctx context.Context, v state.Volume, path string, st *steps) error {
	job, err := s.outputJob(v)
	if err != nil {
		return err
	}
	unlock := s.wb.lock(v.ID)
	defer unlock()
	cur, ok := s.store.GetVolume(v.ID)
	if !ok {
		return nil // uploaded and deleted after an earlier hand-off
	}
	v = cur
	if letGo(v) {
		// Handed off before (a repeated NodeUnstage, or NodeUnpublish of an inline volume):
		// its upload is under way or done, and starting it again would upload every change
		// once more.
		if err := unmountTargetSteps(s.mounter, path, st); err != nil {
			return Internal("unmounting "+path, err)
		}
		return nil
	}
	if err := s.keepAside(v); err != nil {
		return Internal("mounting the volume's filesystem aside for its upload", err)
	}
	st.done("aside")
	if err := unmountTargetSteps(s.mounter, path, st); err != nil {
		return Internal("unmounting "+path, err)
	}
	s.wb.expireCreds(ctx, v.ID, time.Now())
	if err := s.wb.up.Add(job); err != nil {
		return Internal("recording the volume's write-back", err)
	}
	st.done("journal")
	// Node-side: the journal is what a crash resumes from, and Recover drops the marks of mounts
	// that are gone from a record that lags.
	v.Device, v.StagingPath, v.Published, v.ExclusiveTarget = "", "", map[string]bool{}, ""
	if err := s.store.PutVolumeNodeState(v); err != nil {
		return Internal("saving volume state", err)
	}
	st.done("state")
	klog.FromContext(ctx).Info("Volume let go; uploading its outputs", "volumeID", v.ID, "target", job.Target.String())
	s.wb.start(s, job, handOffDelay)
	return nil
}

// letGo says whether v was handed off already: step 4 of handOff cleared what held it (a staged
// or published volume has a staging path or a target).
func letGo(v state.Volume) bool {
	return v.Device == "" && v.StagingPath == "" && len(v.Published) == 0
}

// keepAside mounts v's filesystem, still mounted at its staging or target path, read-only at its
// write-back mount point, unless it is there already (a repeated NodeUnpublish). A volume whose
// image is not attached (the node rebooted) is left to the upload, which attaches it.
func (s *Service) keepAside(v state.Volume) error {
	dev, err := s.attached(v)
	if err != nil || dev == "" {
		return err
	}
	if mountedFrom(s.wb.mountDir(v.ID), dev) {
		return sealAside(s.wb.mountDir(v.ID))
	}
	// A second mount of a block device keeps its superblock's read-only state (EBUSY otherwise:
	// a volume published read-only is mounted read-only); this mount is made read-only alone.
	dir, err := s.wb.mountAt(v, dev, 0)
	if errors.Is(err, unix.EBUSY) {
		dir, err = s.wb.mountAt(v, dev, unix.MS_RDONLY)
	}
	if err != nil {
		return fmt.Errorf("mount %s: %w", dev, err)
	}
	if err := sealAside(dir); err != nil {
		_ = unix.Unmount(dir, 0)
		return fmt.Errorf("making the mount of %s read-only: %w", dev, err)
	}
	return nil
}

// attached is the loop device v's image is attached to, or "".
func (s *Service) attached(v state.Volume) (string, error) {
	img, err := s.ImagePath(v)
	if err != nil {
		return "", err
	}
	return s.images.Find(img)
}

// mountedFrom says whether dir is the root of a mount of the block device dev.
func mountedFrom(dir, dev string) bool {
	var d, b unix.Stat_t
	return unix.Stat(dir, &d) == nil && unix.Stat(dev, &b) == nil && d.Dev == b.Rdev
}

// upload runs a handed-off volume's write-back until it is complete (then an inline volume is
// deleted), or until it expires (writeback_expiry.go). Failures are retried with backoff
// (writeback.Uploader.Run), never dropped: the volume stays until then.
func (s *Service) upload(id string, job writeback.Job) {
	logger := klog.Background().WithValues("volumeID", id, "target", job.Target.String())
	ctx, cancel := s.wb.uploadContext(id)
	defer cancel()
	for wait := time.Second; ; wait = min(2*wait, 5*time.Minute) {
		err := ctx.Err()
		if err == nil {
			if err = s.uploadOnce(ctx, id, job); err == nil {
				logger.Info("Outputs uploaded")
				return
			}
		}
		if s.wb.ctx.Err() != nil {
			return // the node plugin stops; the next one resumes
		}
		if errors.Is(err, writeback.ErrUnconfirmed) {
			// Sending again would end the same way: the upload waits for its expiry, or for
			// the next node plugin, which tries once more (the server may be fixed by then).
			logger.Error(err, "Write-back stopped: the target does not confirm what it stores; the data is kept until the upload expires")
			<-ctx.Done()
			if s.wb.ctx.Err() != nil {
				return
			}
		}
		if ctx.Err() != nil {
			s.expire(id, job)
			return
		}
		logger.Error(err, "Write-back failed; retrying", "in", wait)
		s.wb.setFailing(id, true)
		if s.wb.cfg.OnProgress != nil {
			s.wb.cfg.OnProgress(writeback.Progress{Volume: id, Err: err})
		}
		if v, ok := s.store.GetVolume(id); ok {
			s.wb.emit(v.Parameters, true, ReasonOutputUploadFailed, "Upload of volume %s's outputs to %s cannot start: %v; retrying in %s, the data is kept",
				id, job.Target, err, wait)
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// uploadOnce uploads the volume's upper directory through its filesystem's mount aside and,
// once the journal says every change is at the target, tears the volume down: unmounts it,
// detaches its loop device and deletes an inline volume. A failed or interrupted pass keeps the
// mount for the next one, or for the next node plugin (a restart or an upgrade: the loop device
// outlives the process, and the mount too unless it goes with the container's mount namespace).
func (s *Service) uploadOnce(ctx context.Context, id string, job writeback.Job) error {
	v, ok := s.store.GetVolume(id)
	if !ok {
		return s.wb.forget(id) // deleted already, after an earlier complete upload
	}
	client, err := s.uploadInputs(ctx, v, &job)
	if err != nil {
		return err
	}
	if err := s.mountForUpload(v); err != nil {
		return err
	}
	events := &uploadEvents{w: s.wb, attrs: v.Parameters, id: id, target: job.Target.String()}
	err = s.wb.up.Run(ctx, job, client, func(p writeback.Progress) {
		s.wb.progress(p)
		events.report(p)
	})
	if err != nil {
		return err
	}
	unlock := s.wb.lock(id)
	defer unlock()
	start := time.Now()
	if err := s.releaseAside(v); err != nil {
		return err
	}
	klog.Background().V(4).Info("Uploaded volume torn down", "volumeID", id, "took", time.Since(start).String())
	if !v.Ephemeral {
		// A claim stays, and may be staged and written again: its next upload sends only
		// what changed since this one (DeleteVolume forgets the journal).
		return s.wb.settle(id, s.wb.up.Keep)
	}
	if err := s.Delete(v); err != nil {
		return err
	}
	return s.wb.forget(id)
}

// mountForUpload makes sure v's filesystem is mounted read-only aside: the mount its hand-off
// made, or, when it is gone (the node rebooted), its image attached and mounted again.
func (s *Service) mountForUpload(v state.Volume) error {
	unlock := s.wb.lock(v.ID)
	defer unlock()
	if dev, err := s.attached(v); err == nil && dev != "" && mountedFrom(s.wb.mountDir(v.ID), dev) {
		return sealAside(s.wb.mountDir(v.ID))
	}
	dev, err := s.attach(v)
	if err != nil {
		return err
	}
	if _, err := s.wb.mountAt(v, dev, unix.MS_RDONLY); err != nil {
		_ = s.images.Detach(dev)
		return fmt.Errorf("mounting the volume's filesystem: %w", err)
	}
	return nil
}

// releaseAside unmounts v's filesystem from its write-back mount point and detaches its loop
// device: the teardown its hand-off left to after the upload.
func (s *Service) releaseAside(v state.Volume) error {
	dir := s.wb.mountDir(v.ID)
	if err := unix.Unmount(dir, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting %s: %w", dir, err)
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	dev, err := s.attached(v)
	if err != nil {
		return err
	}
	return s.images.Detach(dev)
}

// checkStageOutput is NodeStageVolume's check of a claim that names an output target: the
// upload of its last use is done, and the stage secrets may write the target. An upload still
// under way that lost its credentials (a reboot) gets the stage's (regainCreds).
func (s *Service) checkStageOutput(ctx context.Context, v state.Volume, r StageRequest) error {
	raw := v.Parameters[consts.ParamOutputTarget]
	if raw == "" {
		return nil
	}
	if msg := s.WriteBackHolds(v.ID); msg != "" {
		if err := s.regainCreds(ctx, v, r); err != nil {
			return err
		}
		return status.Errorf(codes.Unavailable, "%s; retry later", msg)
	}
	if strings.Contains(raw, consts.PodNamespaceVar) || strings.Contains(raw, consts.PodNameVar) {
		return status.Errorf(codes.InvalidArgument, "%s %q: a claim's output target cannot name its pod (%s, %s are for inline volumes)", consts.ParamOutputTarget, raw, consts.PodNamespaceVar, consts.PodNameVar)
	}
	spec, err := recordedDataset(v)
	if err != nil || spec == nil {
		return status.Errorf(codes.InvalidArgument, "%s needs a dataset (source)", consts.ParamOutputTarget)
	}
	return s.checkOutput(ctx, v.ID, raw, spec, r.Secrets, r.VolumeContext)
}

// StopWriteBacks stops the uploads under way and waits for them; their journals keep what was
// done, and the next node plugin resumes them.
func (s *Service) StopWriteBacks() {
	if s.wb == nil {
		return
	}
	s.wb.cancel()
	s.wb.wg.Wait()
}

// resumeWriteBacks starts again the uploads a stopped node plugin left (Recover).
func (s *Service) resumeWriteBacks() {
	if s.wb == nil {
		return
	}
	s.resumeCheckpoints()
	s.sweepCreds()
	jobs, err := s.wb.up.Jobs()
	if err != nil {
		klog.Background().Error(err, "Listing write-backs to resume")
		return
	}
	for _, job := range jobs {
		klog.Background().Info("Resuming write-back", "volumeID", job.Volume, "target", job.Target.String())
		s.wb.start(s, job, 0)
	}
}

// WriteBackHolds says why a volume may be neither deleted nor staged yet: its outputs are being
// uploaded. "" when nothing holds it.
func (s *Service) WriteBackHolds(id string) string {
	if s.wb == nil {
		return ""
	}
	s.wb.mu.Lock()
	running, left := s.wb.running[id], s.wb.pending[id]
	s.wb.mu.Unlock()
	if done, err := s.wb.up.Done(id); running || err != nil || !done {
		return fmt.Sprintf("volume %s keeps its data until its outputs are uploaded (%d bytes left)", id, left)
	}
	return ""
}

// lock serialises a volume's hand-off and its upload's mounting and teardown: a repeated
// NodeUnpublish never mounts aside what the upload is tearing down. It returns the unlock.
func (w *writeBacks) lock(id string) func() {
	w.mu.Lock()
	l := w.locks[id]
	if l == nil {
		l = &volumeLock{}
		w.locks[id] = l
	}
	l.users++
	w.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		w.mu.Lock()
		if l.users--; l.users == 0 {
			delete(w.locks, id)
		}
		w.mu.Unlock()
	}
}

// volumeLock is one volume's lock in writeBacks.locks, kept while anyone holds or waits for it.
type volumeLock struct {
	mu    sync.Mutex
	users int
}

func (w *writeBacks) mountDir(id string) string { return filepath.Join(w.cfg.Dir, "mnt", id) }

// mountAt mounts v's filesystem, on dev, at v's write-back mount point (mountDir), in place of
// whatever an interrupted checkpoint, hand-off or teardown left mounted there, and returns it.
func (w *writeBacks) mountAt(v state.Volume, dev string, flags uintptr) (string, error) {
	dir := w.mountDir(v.ID)
	_ = unix.Unmount(dir, unix.MNT_DETACH)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	return dir, mountFilesystem(dev, dir, v.FSType, flags)
}

// forget ends volume id's write-back with the volume: its journal goes.
func (w *writeBacks) forget(id string) error { return w.settle(id, w.up.Forget) }

// settle ends volume id's upload: nothing of it is pending, its saved secrets go, and end
// (Uploader.Forget or Keep) decides what of its journal stays.
func (w *writeBacks) settle(id string, end func(volume string) error) error {
	w.mu.Lock()
	delete(w.pending, id)
	delete(w.namespace, id)
	delete(w.failing, id)
	w.outputsChanged()
	w.mu.Unlock()
	if err := w.creds.Remove(id); err != nil {
		return err
	}
	return end(id)
}

func (w *writeBacks) progress(p writeback.Progress) {
	unconfirmed := errors.Is(p.Err, writeback.ErrUnconfirmed)
	if p.Err != nil && !unconfirmed {
		klog.Background().Error(p.Err, "Write-back refused; retrying with backoff, the volume's data kept", "volumeID", p.Volume, "attempt", p.Attempt,
			"bytesDone", p.BytesDone, "bytes", p.Bytes)
	}
	w.mu.Lock()
	if p.Err != nil {
		w.refusals++
	}
	if unconfirmed {
		w.unconfirmed++
	}
	if p.Done {
		delete(w.pending, p.Volume)
	} else if p.Bytes > 0 {
		w.pending[p.Volume] = p.Bytes - p.BytesDone
	}
	w.mu.Unlock()
	w.setFailing(p.Volume, p.Err != nil) // moves the generation only when it changes
	if w.cfg.OnProgress != nil {
		w.cfg.OnProgress(p)
	}
}

// setFailing records whether an upload's last pass failed, moving OutputsGeneration when that
// changes.
func (w *writeBacks) setFailing(id string, failing bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failing[id] != failing {
		if failing {
			w.failing[id] = true
		} else {
			delete(w.failing, id)
		}
		w.outputsChanged()
	}
}
