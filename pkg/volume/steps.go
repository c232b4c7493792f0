package volume

import (
	"context"
	"time"

	"k8s.io/klog/v2"
)

// steps times the steps of a volume's release (NodeUnpublish, NodeUnstage) for one log line at
// V(4), so that a slow one shows where its time went: the unmount of each stacked mount, the
// write-back's hand-off, the loop device's detach, the state writes. A nil *steps times nothing.
type steps struct {
	start, last time.Time
	kv          []any
}

func newSteps() *steps {
	now := time.Now()
	return &steps{start: now, last: now}
}

// done records the time since the previous step under name.
func (t *steps) done(name string) {
	if t == nil {
		return
	}
	now := time.Now()
	t.kv = append(t.kv, name, now.Sub(t.last).Round(time.Microsecond).String())
	t.last = now
}

// log writes the steps, with the total, at V(4).
func (t *steps) log(ctx context.Context, msg, volumeID string) {
	if t == nil {
		return
	}
	kv := append([]any{"volumeID", volumeID, "took", time.Since(t.start).Round(time.Microsecond).String()}, t.kv...)
	klog.FromContext(ctx).V(4).Info(msg, kv...)
}
