package volume

import (
	"errors"
	"fmt"
	"time"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/writeback"
)

// The reasons of the write-back's Events, on the pod (inline volumes, per-pod copies of static
// PVs) or the claim whose outputs they are (docs/datasets.md, "Write-back").
const (
	ReasonOutputTargetRefused  = "OutputTargetRefused"
	ReasonOutputUploadStarted  = "OutputUploadStarted"
	ReasonOutputUploadFailed   = "OutputUploadFailed"
	ReasonOutputUploadFinished = "OutputUploadFinished"
	ReasonOutputUploadExpired  = "OutputUploadExpired"
	// ReasonOutputUploadUnconfirmed: the target confirmed neither the checksum nor the MD5 of
	// what it stored (writeback.ErrUnconfirmed); the upload is not retried.
	ReasonOutputUploadUnconfirmed = "OutputUploadUnconfirmed"
)

// ObjectRef names the Kubernetes object a volume's Events are about. UID may be empty (a claim:
// the recorder looks it up).
type ObjectRef struct {
	Kind, Namespace, Name, UID string
}

// Event is one Event of the write-back about a volume, for WriteBack.OnEvent.
type Event struct {
	Object  ObjectRef
	Warning bool
	Reason  string
	Message string
}

// eventObject is whom a volume's Events are about: the pod kubelet named (podInfoOnMount) for an
// inline volume or a per-pod copy, the claim external-provisioner named for a dynamic volume;
// false when the volume names neither.
func eventObject(attrs map[string]string) (ObjectRef, bool) {
	if name, ns := attrs[consts.VolumeContextPodName], attrs[consts.VolumeContextPodNamespace]; name != "" && ns != "" {
		return ObjectRef{Kind: "Pod", Namespace: ns, Name: name, UID: attrs[consts.VolumeContextPodUID]}, true
	}
	if name, ns := attrs[consts.ParamPVCName], attrs[consts.ParamPVCNamespace]; name != "" && ns != "" {
		return ObjectRef{Kind: "PersistentVolumeClaim", Namespace: ns, Name: name}, true
	}
	return ObjectRef{}, false
}

// emit sends an Event about the volume with attrs, when Events are on and it names an object.
func (w *writeBacks) emit(attrs map[string]string, warning bool, reason, format string, args ...any) {
	if w.cfg.OnEvent == nil {
		return
	}
	if obj, ok := eventObject(attrs); ok {
		w.cfg.OnEvent(Event{Object: obj, Warning: warning, Reason: reason, Message: fmt.Sprintf(format, args...)})
	}
}

// uploadEvents turns one upload's progress into Events: started once the first pass measured
// the changes, each failed pass (it is retried), finished.
type uploadEvents struct {
	w       *writeBacks
	attrs   map[string]string
	id      string
	target  string
	started bool
}

func (e *uploadEvents) report(p writeback.Progress) {
	switch {
	case p.Done:
		e.w.emit(e.attrs, false, ReasonOutputUploadFinished,
			"Outputs of volume %s are at %s: %d objects, %d bytes (%d sent by this node plugin), %d deleted, %d entries skipped (not files); the volume's data is released",
			e.id, e.target, p.FilesDone, p.BytesDone, p.Sent, p.DeletesDone, p.Skipped)
	case errors.Is(p.Err, writeback.ErrUnconfirmed):
		e.w.emit(e.attrs, true, ReasonOutputUploadUnconfirmed,
			"Upload of volume %s's outputs to %s stopped: %v; %d of %d objects, %d of %d bytes confirmed. Sending again would not confirm them: the upload is not retried, the data is kept until it expires (a restarted node plugin tries once more)",
			e.id, e.target, p.Err, p.FilesDone, p.Files, p.BytesDone, p.Bytes)
	case p.Err != nil:
		e.w.emit(e.attrs, true, ReasonOutputUploadFailed,
			"Upload of volume %s's outputs to %s failed (attempt %d): %v; %d of %d objects, %d of %d bytes done; retrying in %s, the data is kept",
			e.id, e.target, p.Attempt, p.Err, p.FilesDone, p.Files, p.BytesDone, p.Bytes, p.RetryIn.Round(time.Second))
	case !e.started && p.Attempt > 0:
		e.started = true
		e.w.emit(e.attrs, false, ReasonOutputUploadStarted,
			"Uploading the outputs of volume %s to %s: %d objects, %d bytes (%d bytes already there), %d to delete",
			e.id, e.target, p.Files, p.Bytes, p.BytesDone, p.Deletes)
	}
}
