package datasource

import (
	"context"
	"errors"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/cistern-csi/cistern/pkg/datasource/dataset"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// errAbandoned ends a staging nobody waits for any more.
var errAbandoned = source.Errorf(source.Invalid, "staging abandoned: no volume asked for it any more")

// errTooSlow ends a read slower than the minimum throughput; it is retried like any failed read.
var errTooSlow = errors.New("read slower than the minimum throughput")

// sourceSlots returns the concurrency slots of spec's source endpoint.
func (m *Manager) sourceSlots(spec *Spec) chan struct{} {
	key := dataset.SourceKey(spec)
	m.mu.Lock()
	defer m.mu.Unlock()
	ch := m.perSource[key]
	if ch == nil {
		ch = make(chan struct{}, m.limits.PerSource)
		m.perSource[key] = ch
	}
	return ch
}

// watchInterest cancels the job when nobody asked for it in AbandonAfter.
func (j *job) watchInterest(ctx context.Context, cancel context.CancelCauseFunc) {
	after := j.m.limits.AbandonAfter
	_ = wait.PollUntilContextCancel(ctx, min(after/4, time.Minute), false, func(context.Context) (bool, error) {
		if time.Since(time.Unix(0, j.wanted.Load())) <= after {
			return false, nil
		}
		cancel(errAbandoned)
		return true, nil
	})
}
