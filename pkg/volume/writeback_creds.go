package volume

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/state"
	"github.com/cistern-csi/cistern/pkg/writeback/credstore"
)

// The credentials of uploads to S3 targets (docs/security.md, "Write-back"): the pod and its
// Secret are gone when its outputs upload, so checkOutput keeps the keys it probed the target
// with, sealed in <--writeback-dir>/secrets/ under a key the kernel holds in memory
// (pkg/writeback/credstore), never in plaintext on disk. They are kept while the volume is in
// use, and after its hand-off until its upload completes or expires: at the hand-off they are
// sealed again with the upload's expiry (--writeback-max-age). A reboot loses them with the
// kernel's key: the uploads that needed them fail, reported at each attempt, until they expire
// or, for a claim, until its next NodeStageVolume brings credentials again (regainCreds).

func openCreds(dir string) (*credstore.Store, error) {
	st, err := credstore.Open(filepath.Join(dir, "secrets"))
	if err != nil {
		return nil, err
	}
	if !st.Persistent() {
		klog.Background().Info("No kernel keyring: write-back credentials are sealed with a key of this process, which a restart of the node plugin loses (uploads to S3 targets then wait until they expire)")
	}
	return st, nil
}

// saveSecrets keeps the credentials an upload needs after the pod, and its secret, are gone.
func (w *writeBacks) saveSecrets(id string, secrets map[string]string) error {
	if err := w.creds.Save(id, secrets, time.Time{}); err != nil {
		return Internal("saving write-back credentials", err)
	}
	return nil
}

// loadSecrets opens an upload's credentials: nil for an anonymous volume, credstore.ErrLost or
// ErrExpired when they are gone.
func (w *writeBacks) loadSecrets(id string) (map[string]string, error) {
	return w.creds.Load(id)
}

// expireCreds gives volume id's credentials, at its hand-off (now), its upload's expiry. A
// failure (none could be read: lost) leaves them as they are, and the upload reports it.
func (w *writeBacks) expireCreds(ctx context.Context, id string, now time.Time) {
	if w.cfg.MaxAge <= 0 {
		return
	}
	if err := w.creds.Expire(id, now.Add(w.cfg.MaxAge)); err != nil {
		klog.FromContext(ctx).Info("Could not give the write-back credentials their expiry", "volumeID", id, "err", err.Error())
	}
}

// sweepCreds removes, at start, the credentials of volumes the node has no record of: a
// publication refused after its probe, a crash between the two.
func (s *Service) sweepCreds() {
	ids, err := s.wb.creds.IDs()
	if err != nil {
		klog.Background().Error(err, "Listing write-back credentials")
		return
	}
	for _, id := range ids {
		if _, ok := s.store.GetVolume(id); !ok {
			if err := s.wb.creds.Remove(id); err != nil {
				klog.Background().Error(err, "Removing write-back credentials of a volume that is gone", "volumeID", id)
			}
		}
	}
}

// regainCreds gives the upload of claim v, under way with its credentials lost (a reboot), those
// of the claim's next NodeStageVolume, once they wrote the probe: kubelet hands credentials over
// only there, and the upload's next attempt goes on with them. They get the upload's expiry.
// Nothing is done for an upload whose credentials are there, or that needs none.
func (s *Service) regainCreds(ctx context.Context, v state.Volume, r StageRequest) error {
	if _, err := s.wb.loadSecrets(v.ID); !errors.Is(err, credstore.ErrLost) {
		return nil
	}
	spec, err := recordedDataset(v)
	if err != nil || spec == nil {
		return nil
	}
	t, err := outputTarget(v.Parameters[consts.ParamOutputTarget], v.Parameters, tenantOutput(spec))
	if err != nil || t.NFS() {
		return err
	}
	if err := s.probeS3(ctx, v.ID, t, spec, r.Secrets, r.VolumeContext); err != nil {
		return err
	}
	var expires time.Time
	if s.wb.cfg.MaxAge > 0 {
		at := s.wb.up.HandedOff(v.ID)
		if at.IsZero() {
			at = time.Now()
		}
		expires = at.Add(s.wb.cfg.MaxAge)
	}
	if err := s.wb.creds.Save(v.ID, r.Secrets, expires); err != nil {
		return Internal("saving write-back credentials", err)
	}
	klog.FromContext(ctx).Info("Upload's lost credentials replaced by the claim's stage secrets", "volumeID", v.ID)
	return nil
}
