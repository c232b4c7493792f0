package dataset

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// ListingSlots bound the listings (stagings' and access proofs') under way on the node, for the
// callers of one namespace, and against one source endpoint (Limits.Listings,
// ListingsPerNamespace, ListingsPerSource), and take the slots back from a listing slower than
// Limits.ListingMinRate.
type ListingSlots struct {
	limits     Limits
	node       chan struct{}
	namespaces keyedSlots
	sources    keyedSlots
}

// NewListingSlots returns the listing slots of a node with limits l (defaults filled).
func NewListingSlots(l Limits) *ListingSlots {
	return &ListingSlots{limits: l, node: make(chan struct{}, l.Listings),
		namespaces: keyedSlots{size: l.ListingsPerNamespace}, sources: keyedSlots{size: l.ListingsPerSource}}
}

// Source returns src, whose listings run within the listing slots of spec's caller and source
// endpoint: List waits for them, and ends with a Retryable error naming the minimum rate when
// the listing goes slower (ErrListingTooSlow). Its other methods are src's.
func (s *ListingSlots) Source(spec *Spec, src source.Source) source.Source {
	return &slotted{Source: src, slots: s, spec: spec}
}

// ErrListingTooSlow is in the error of a listing that lost its slots to the minimum rate.
var ErrListingTooSlow = errors.New("listing slower than the minimum listing rate")

// acquire waits for a listing slot of spec's namespace (none for an administrator's volume,
// which names no namespace), of its source endpoint and of the node, in that order, and returns
// their release: a listing waiting for a slot holds none of the later ones, and a namespace's
// waiting listings hold only that namespace's slots.
func (s *ListingSlots) acquire(ctx context.Context, spec *Spec) (func(), error) {
	releaseNS := func() {}
	if spec.Namespace != "" {
		r, err := s.namespaces.acquire(ctx, spec.Namespace)
		if err != nil {
			return nil, source.Wrap(source.Retryable, err, "waiting for a listing slot of namespace %s", spec.Namespace)
		}
		releaseNS = r
	}
	releaseSource, err := s.sources.acquire(ctx, SourceKey(spec))
	if err != nil {
		releaseNS()
		return nil, source.Wrap(source.Retryable, err, "waiting for a listing slot of the source")
	}
	select {
	case s.node <- struct{}{}:
	case <-ctx.Done():
		releaseSource()
		releaseNS()
		return nil, source.Wrap(source.Retryable, context.Cause(ctx), "waiting for a listing slot of the node")
	}
	return func() { <-s.node; releaseSource(); releaseNS() }, nil
}

// slotted is a source whose listings hold listing slots (ListingSlots.Source).
type slotted struct {
	source.Source
	slots *ListingSlots
	spec  *Spec
}

func (s *slotted) List(ctx context.Context, fn func(source.Object) error) error {
	release, err := s.slots.acquire(ctx, s.spec)
	if err != nil {
		return err
	}
	defer release()
	ctx, cancel := context.WithCancelCause(ctx)
	var seen atomic.Int64
	done := make(chan struct{})
	defer func() { cancel(nil); <-done }()
	go func() { defer close(done); s.slots.watchRate(ctx, cancel, &seen) }()
	if c, ok := s.Source.(source.CountingLister); ok {
		err = c.ListCounting(ctx, fn, func() { seen.Add(1) })
	} else {
		err = s.Source.List(ctx, func(o source.Object) error { seen.Add(1); return fn(o) })
	}
	if cause := context.Cause(ctx); err != nil && errors.Is(cause, ErrListingTooSlow) {
		return cause
	}
	return err
}

// watchRate cancels ctx when a window of the listing went through fewer entries than the
// minimum rate asks, until ctx ends.
func (s *ListingSlots) watchRate(ctx context.Context, cancel context.CancelCauseFunc, seen *atomic.Int64) {
	rate, window := s.limits.ListingMinRate, s.limits.ListingRateWindow
	t := time.NewTicker(window)
	defer t.Stop()
	var last int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n := seen.Load()
		if float64(n-last) < rate*window.Seconds() {
			cancel(source.Wrap(source.Retryable, ErrListingTooSlow, "the source listed %d entries in %s, fewer than the %g a second the node asks of a listing (--listing-min-rate over --listing-rate-window); it gave up its listing slot",
				n-last, window, rate))
			return
		}
		last = n
	}
}

// keyedSlots are counting semaphores by key, of size slots each. A key's semaphore goes with its
// last holder or waiter, so endless keys (endpoint spellings, namespaces) grow nothing; x/sync's
// semaphore is a single one, and a map of them would keep every key it ever saw.
type keyedSlots struct {
	size int

	mu   sync.Mutex
	keys map[string]*keyedSlot
}

type keyedSlot struct {
	slots chan struct{}
	users int // holders and waiters
}

// acquire waits for a slot of key and returns its release.
func (k *keyedSlots) acquire(ctx context.Context, key string) (func(), error) {
	k.mu.Lock()
	if k.keys == nil {
		k.keys = map[string]*keyedSlot{}
	}
	e := k.keys[key]
	if e == nil {
		e = &keyedSlot{slots: make(chan struct{}, k.size)}
		k.keys[key] = e
	}
	e.users++
	k.mu.Unlock()
	leave := func() {
		k.mu.Lock()
		if e.users--; e.users == 0 {
			delete(k.keys, key)
		}
		k.mu.Unlock()
	}
	select {
	case e.slots <- struct{}{}:
		return func() { <-e.slots; leave() }, nil
	case <-ctx.Done():
		leave()
		return nil, context.Cause(ctx)
	}
}

// held reports the keys with a holder or waiter, for tests.
func (k *keyedSlots) held() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.keys)
}
