package volume

import (
	"context"
	"time"

	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/writeback"
)

// An upload pending for longer than --writeback-max-age after its hand-off expires
// (docs/security.md, "Write-back"): a target that refuses for that long (the tenant's keys
// revoked, the bucket gone, the server down, the keys lost in a reboot) then no longer holds the
// node's budget, its pool's space and the tenant's keys. The upload stops, a Warning Event
// (OutputUploadExpired) on the pod or claim and cistern_writeback_expired_total report it, the
// credentials kept for it are deleted, and its data goes as it would have after a complete
// upload: an inline volume (or a static PV's copy) is deleted with the outputs that did not
// reach the target; a claim keeps them in its volume, which it no longer holds (DeleteVolume
// deletes it; staged and let go again, it uploads again from where its journal stopped). The
// deadline counts from the hand-off recorded in the journal, so a node plugin down at that
// moment expires the upload when it starts.

// uploadContext is the context of volume id's upload: it ends when the node plugin stops, or at
// the upload's expiry.
func (w *writeBacks) uploadContext(id string) (context.Context, context.CancelFunc) {
	if w.cfg.MaxAge <= 0 {
		return context.WithCancel(w.ctx)
	}
	at := w.up.HandedOff(id)
	if at.IsZero() {
		at = time.Now() // a journal older than hand-off times: the age counts from here
	}
	return context.WithDeadline(w.ctx, at.Add(w.cfg.MaxAge))
}

// expire ends volume id's upload at its expiry, as above.
func (s *Service) expire(id string, job writeback.Job) {
	logger := klog.Background().WithValues("volumeID", id, "target", job.Target.String())
	v, ok := s.store.GetVolume(id)
	if !ok {
		_ = s.wb.forget(id)
		return
	}
	s.wb.mu.Lock()
	left := s.wb.pending[id]
	s.wb.expired++
	s.wb.mu.Unlock()
	unlock := s.wb.lock(id)
	defer unlock()
	err := s.releaseAside(v)
	switch {
	case err != nil:
	case v.Ephemeral:
		if err = s.Delete(v); err == nil {
			err = s.wb.forget(id)
		}
	default:
		err = s.wb.settle(id, s.wb.up.Expire)
	}
	if err != nil {
		logger.Error(err, "Expiring the upload; the next node plugin tries again")
	}
	logger.Info("Upload expired", "maxAge", s.wb.cfg.MaxAge.String(), "bytesLeft", left)
	data := "the claim keeps them in its volume, which no longer waits for this upload (it may be deleted; staged and let go again, it uploads from where this upload stopped)"
	if v.Ephemeral {
		data = "they are deleted with the volume"
	}
	s.wb.emit(v.Parameters, true, ReasonOutputUploadExpired,
		"Upload of volume %s's outputs to %s expired, pending longer than node %s allows (--writeback-max-age %s): up to %d bytes of outputs did not reach the target and %s; the credentials kept for the upload are deleted",
		id, job.Target, s.nodeID, s.wb.cfg.MaxAge, left, data)
}
