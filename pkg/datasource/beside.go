package datasource

// Versions staged side by side. A caller whose listing differs from every staging of a dataset
// under way (other credentials that resolve the bucket to other data, a source that changed)
// gets a staging of its own in a directory beside them (cache.Beside), rather than waiting for
// them: a staging that streaming volumes read may go on for as long as their pods live. Each
// version is staged once, and a ready one beside the current becomes a kept version
// (docs/security.md, "Versions side by side").

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-logr/logr"

	"github.com/cistern-csi/cistern/pkg/datasource/access"
	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// joinOrBeside hands a caller one of the stagings under way of its dataset (js): its own at
// once; else a ready version it proves it reads (keptHit), or a staging whose manifest it
// proves it reads. A caller that sees other data than all of them gets a staging of its own
// beside them. again: the stagings changed meanwhile, ensure looks again.
func (m *Manager) joinOrBeside(ctx context.Context, logger logr.Logger, req Request, js []*staging, who string) (Status, *staging, bool, error) {
	for _, j := range js {
		if j.principal == who {
			st, j, err := m.join(ctx, req, j, who)
			return st, j, false, err
		}
	}
	if st, ok, err := m.keptHit(ctx, req); ok {
		return st, nil, false, err
	}
	for _, j := range js {
		st, j, err := m.join(ctx, req, j, who)
		if !errors.Is(err, access.ErrListingDiffers) {
			return st, j, false, err
		}
	}
	logger.Info("the stagings under way differ from the caller's listing; staging its version beside them", "stagings", len(js))
	return m.startBeside(logger, req, len(js), who)
}

// startBeside starts the caller's staging in a directory of its own beside the n stagings of
// its dataset it found under way, all of other data; at most Limits.MaxVersions stagings of one
// dataset run at once on a pool.
func (m *Manager) startBeside(logger logr.Logger, req Request, n int, who string) (Status, *staging, bool, error) {
	id := req.Spec.ID()
	key := jobKey(req.Pool, id)
	pl := m.cache.Lock(req.Pool)
	pl.Lock()
	m.mu.Lock()
	now := len(m.jobs[key])
	m.mu.Unlock()
	if now != n {
		pl.Unlock()
		return Status{}, nil, true, nil // one started or ended meanwhile: perhaps the caller's own
	}
	if now >= m.limits.MaxVersions {
		pl.Unlock()
		return Status{}, nil, false, fmt.Errorf("%s: %w", req.Spec.Describe(), source.Errorf(source.Retryable,
			"%d other versions of it are being staged on this pool, the most the node allows (--max-dataset-versions); retry", now))
	}
	st, j, err := m.startStaging(logger, req, pl, key, who, cache.Beside(req.Pool, id))
	return st, j, false, err
}

// settleBeside ends a staging beside the dataset's directory: a ready one becomes a kept
// version (cache.Cache.Settle); a failed one is never resumed, so its directory goes (or is
// retired while streaming volumes read it). It returns the staging's outcome.
func (m *Manager) settleBeside(j *staging, err error) error {
	if err == nil {
		md, digest := j.Manifest()
		if err = m.cache.Settle(j.Pool(), j.Dir(), digest, m.limits.MaxVersions); err == nil {
			return nil
		}
		err = fmt.Errorf("%s: keeping the staged version (%d objects): %w", j.Spec().Describe(), md.Objects, err)
	}
	if derr := m.cache.Discard(j.Pool(), j.Dir()); derr != nil {
		err = errors.Join(err, derr)
	}
	return err
}

// keptHit serves a caller that is no staging's own a ready version it proves it reads, rather
// than making it wait for a staging of other data; ok is false when there is none.
func (m *Manager) keptHit(ctx context.Context, req Request) (Status, bool, error) {
	vs := cache.ReadyVersions(req.Pool, req.Spec.ID())
	if len(vs) == 0 {
		return Status{}, false, nil
	}
	st, err := m.hit(ctx, req, vs)
	if errors.Is(err, access.ErrListingDiffers) {
		return Status{}, false, nil
	}
	return st, true, err
}

// join hands a staging under way to a caller: at once to the caller that started it; to any
// other once the manifest is taken and the caller proved it reads the same data. Until then the
// caller is told only that the dataset is being listed. ErrListingDiffers (wrapped): the caller
// sees other data.
func (m *Manager) join(ctx context.Context, req Request, j *staging, who string) (Status, *staging, error) {
	if j.principal != who {
		select {
		case <-j.Listed():
		case <-j.done:
			if !j.IsListed() {
				return checking(req.Spec), j, nil // failed or ended before its listing: the caller retries
			}
		case <-ctx.Done():
			return checking(req.Spec), nil, nil
		}
		md, digest := j.Manifest()
		if err := m.prove(ctx, req, j.Dir(), md, digest); err != nil {
			switch {
			case ctx.Err() != nil && errors.Is(err, ctx.Err()):
				return checking(req.Spec), nil, nil
			case ended(j) && !errors.Is(err, access.ErrListingDiffers):
				// Its version moved meanwhile (kept, beside): the retry finds it ready.
				return checking(req.Spec), nil, nil
			}
			return Status{}, nil, fmt.Errorf("%s: %w", req.Spec.Describe(), err)
		}
	}
	// Wanted by its own caller, or by one that proved it reads it; not by one that sees other data.
	j.Want()
	st := j.Status()
	// The job may still be listing: then its size so far is a lower bound.
	if err := checkCapacity(req, st.BytesTotal, j.Alloc(), j.IsListed()); err != nil {
		return st, nil, fmt.Errorf("%s: %w", req.Spec.Describe(), err)
	}
	return st, j, nil
}

// ended reports whether j's staging ended.
func ended(j *staging) bool {
	select {
	case <-j.done:
		return true
	default:
		return false
	}
}
