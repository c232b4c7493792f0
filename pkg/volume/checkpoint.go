package volume

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/state"
	"github.com/cistern-csi/cistern/pkg/writeback"
)

// Checkpoints (docs/datasets.md, "Write-back"): a volume that names outputInterval uploads what
// changed at that interval while it is in use (an inline volume or per-pod copy while published,
// a claim while staged), through the journal its final upload then goes on from. One checkpoint
// runs at a time on the node, whatever the number of volumes; --writeback-min-interval bounds
// each volume's interval below.

// checkInterval refuses an output interval below the node's minimum.
func (s *Service) checkInterval(attrs map[string]string) error {
	raw := attrs[consts.ParamOutputInterval]
	if raw == "" {
		return nil
	}
	d, err := time.ParseDuration(raw)
	if err != nil || d <= 0 {
		return status.Errorf(codes.InvalidArgument, "%s %q is not a positive duration", consts.ParamOutputInterval, raw)
	}
	if d < s.wb.cfg.MinInterval {
		return status.Errorf(codes.InvalidArgument, "%s %s is below the %s node %s allows (--writeback-min-interval)", consts.ParamOutputInterval, d, s.wb.cfg.MinInterval, s.nodeID)
	}
	return nil
}

// startCheckpoints starts the checkpoints of a layered volume now in use that names an output
// interval, unless they run already.
func (s *Service) startCheckpoints(v state.Volume) {
	raw := v.Parameters[consts.ParamOutputInterval]
	if s.wb == nil || raw == "" || v.Parameters[consts.ParamOutputTarget] == "" || v.DatasetLayer == "" {
		return
	}
	interval, err := time.ParseDuration(raw)
	if err != nil || interval < s.wb.cfg.MinInterval {
		return // checked at publish or stage
	}
	w := s.wb
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.live[v.ID] != nil {
		return
	}
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan struct{})
	w.live[v.ID] = &liveVolume{cancel: cancel, done: done}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if !s.checkpointOnce(ctx, v.ID) {
					return
				}
			}
		}
	}()
}

// liveVolume is the checkpoints of a volume in use.
type liveVolume struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// stopCheckpoints stops a volume's checkpoints and waits for the one under way to end (it is
// cancelled: what it did is in the journal), before the volume is unmounted.
func (s *Service) stopCheckpoints(id string) {
	if s.wb == nil {
		return
	}
	s.wb.mu.Lock()
	lv := s.wb.live[id]
	delete(s.wb.live, id)
	s.wb.mu.Unlock()
	if lv != nil {
		lv.cancel()
		<-lv.done
	}
}

// checkpointOnce takes one checkpoint of a volume in use, one at a time on the node. A failure
// is logged and reported; the next checkpoint, or the final upload, goes on from the journal.
// It says whether the checkpoints go on: not once the target confirmed neither the checksum
// nor the MD5 of what it stored (writeback.ErrUnconfirmed), since every later checkpoint would
// send the same bytes to end the same way; the final upload tries once more.
func (s *Service) checkpointOnce(ctx context.Context, id string) bool {
	select {
	case s.wb.checkpointing <- struct{}{}:
		defer func() { <-s.wb.checkpointing }()
	case <-ctx.Done():
		return false
	}
	v, ok := s.store.GetVolume(id)
	if !ok || v.Device == "" {
		return true
	}
	logger := klog.Background().WithValues("volumeID", id)
	err := s.checkpoint(ctx, v)
	if ctx.Err() != nil {
		return false // the volume is let go: its final upload follows
	}
	s.wb.mu.Lock()
	s.wb.checkpoints++
	if err != nil {
		s.wb.refusals++
	}
	s.wb.mu.Unlock()
	switch {
	case errors.Is(err, writeback.ErrUnconfirmed):
		logger.Error(err, "Checkpoints stopped: the target does not confirm what it stores; the final upload tries once more")
		s.wb.emit(v.Parameters, true, ReasonOutputUploadUnconfirmed, "Checkpoints of volume %s's outputs stopped: %v; the final upload tries once more when the volume is let go", id, err)
		return false
	case err != nil:
		logger.Error(err, "Checkpoint failed; the next one, or the final upload, goes on from here")
		s.wb.emit(v.Parameters, true, ReasonOutputUploadFailed, "Checkpoint of volume %s's outputs failed: %v; the next checkpoint or the final upload goes on from here", id, err)
	}
	return true
}

// checkpoint mounts the volume's filesystem, in use, aside (the same filesystem: its upper
// directory as the overlay writes it) and uploads what changed since the last checkpoint.
func (s *Service) checkpoint(ctx context.Context, v state.Volume) error {
	job, err := s.outputJob(v)
	if err != nil {
		return err
	}
	client, err := s.uploadInputs(ctx, v, &job)
	if err != nil {
		return err
	}
	// Read-write as the mounted filesystem is (a second mount of a block device must keep
	// its read-only state); nothing is written through it.
	dir, err := s.wb.mountAt(v, v.Device, 0)
	if err != nil {
		return fmt.Errorf("mounting the volume's filesystem aside: %w", err)
	}
	defer func() {
		_ = unix.Unmount(dir, 0)
		_ = os.Remove(dir)
	}()
	var last writeback.Progress
	err = s.wb.up.Checkpoint(ctx, job, client, func(p writeback.Progress) {
		s.wb.progress(p)
		last = p
	})
	if err == nil {
		klog.Background().V(2).Info("Checkpoint uploaded", "volumeID", v.ID, "target", job.Target.String(),
			"files", last.FilesDone, "bytes", last.BytesDone, "sent", last.Sent, "deferred", last.Deferred)
	}
	return err
}

// outputJob is the write-back job of a layered volume that names an output target: the same
// for its checkpoints and its final upload, so that they share one journal.
func (s *Service) outputJob(v state.Volume) (writeback.Job, error) {
	spec, err := recordedDataset(v)
	if err != nil {
		return writeback.Job{}, err
	}
	t, err := outputTarget(v.Parameters[consts.ParamOutputTarget], v.Parameters, tenantOutput(spec))
	if err != nil {
		return writeback.Job{}, err
	}
	// A volume whose journal began before tenants' NFS targets were confined to their namespace
	// (an upgrade while it was in use) goes on with the target it began with: its journal is of
	// that job, and a hand-off of another would fail.
	if rec, ok := s.wb.up.Recorded(v.ID); ok && t.Namespace != "" && rec.Target == (writeback.Target{Host: t.Host, Prefix: t.Prefix}) {
		t = rec.Target
	}
	deletes, _ := strconv.ParseBool(v.Parameters[consts.ParamOutputDeletions]) // checked when it was created
	return writeback.Job{Volume: v.ID, Upper: filepath.Join(s.wb.mountDir(v.ID), LayerUpperDir), Target: t, Deletes: deletes}, nil
}

// resumeCheckpoints starts again the checkpoints of the volumes in use that a stopped node
// plugin left (Recover).
func (s *Service) resumeCheckpoints() {
	if s.wb == nil {
		return
	}
	for _, v := range s.store.ListVolumes() {
		if v.Device != "" && (v.StagingPath != "" || len(v.Published) > 0) {
			s.startCheckpoints(v)
		}
	}
}
