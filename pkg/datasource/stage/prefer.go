package stage

// Preferred entries: a streaming volume's read of a file the job has not committed yet asks the
// job to fetch that file next (Prefer) and waits for its commit, rather than downloading it a
// second time beside the job: both downloads shared the 2 cores and the server, and reading an
// uncached 2 GiB object right after publish took 1.53× "staged, then read"
// (docs/benchmarks.md, "Streaming volumes").

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// preferring is what the job knows of each entry for preferred reads: whether its task was sent
// (taken: by the manifest's order or preferred, never both) and whether it is committed. One
// bit each per entry, so memory stays small whatever the manifest's size.
type preferring struct {
	taken, done []atomic.Uint64

	mu      sync.Mutex
	waiters map[int64]chan struct{} // closed at the entry's commit
	pending []preferred             // preferred entries not sent yet
	wake    chan struct{}           // one signal: pending grew
	closed  bool                    // every entry is taken: nothing more to send
}

type preferred struct {
	i   int64
	obj source.Object
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// init sizes the bits for n entries; before the job is listed, Prefer answers nil.
func (p *preferring) init(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	words := (n + 63) / 64
	p.taken, p.done = make([]atomic.Uint64, words), make([]atomic.Uint64, words)
	p.waiters, p.wake = map[int64]chan struct{}{}, make(chan struct{}, 1)
}

func bit(i int64) (int64, uint64) { return i / 64, 1 << (i % 64) }

// take marks entry i's task sent; false when it already was.
func (p *preferring) take(i int64) bool {
	w, b := bit(i)
	if w >= int64(len(p.taken)) {
		return true // not sized (a test's job): no preferred reads
	}
	return p.taken[w].Or(b)&b == 0
}

// committed marks entry i in staging/ and wakes the reads waiting for it.
func (p *preferring) committed(i int64) {
	w, b := bit(i)
	if w >= int64(len(p.done)) {
		return
	}
	p.done[w].Or(b)
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.waiters[i]; ok {
		close(c)
		delete(p.waiters, i)
	}
}

// Prefer asks the job to fetch manifest entry i (obj) before the rest of its queue, unless its
// task was already sent, and returns a channel closed once entry i is committed to staging/
// (verified). It returns nil before the job is listed, or for an entry it does not have. The
// channel is not closed when the job fails: callers also watch the job's end.
func (j *Job) Prefer(i int64, obj source.Object) <-chan struct{} {
	p := &j.prefer
	p.mu.Lock()
	defer p.mu.Unlock()
	w, b := bit(i)
	if i < 0 || i >= j.objsTotal.Load() || w >= int64(len(p.done)) {
		return nil
	}
	if p.done[w].Load()&b != 0 {
		return closedChan
	}
	c, waited := p.waiters[i]
	if waited {
		return c // asked for already: pending, sent, or under way
	}
	c = make(chan struct{})
	p.waiters[i] = c
	if p.taken[w].Load()&b == 0 && !p.closed {
		p.pending = append(p.pending, preferred{i: i, obj: obj})
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
	return c
}

// takePending returns the preferred entries not sent yet.
func (p *preferring) takePending() []preferred {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps := p.pending
	p.pending = nil
	return ps
}

// sendPreferred sends the tasks of preferred entries on first, which the workers read before
// the manifest's order, until stop is called (every entry sent by then: later preferred reads
// only wait). A failure to send one (its ranges cannot be planned, say) fails the job, as it
// would have in the manifest's order.
func (j *Job) sendPreferred(ctx context.Context, cancel context.CancelCauseFunc, first chan<- task) (stop func()) {
	p := &j.prefer
	quit, ended := make(chan struct{}), make(chan struct{})
	send := func() {
		for _, e := range p.takePending() {
			if err := j.sendEntry(ctx, first, nil, e.i, e.obj); err != nil {
				cancel(err)
				return
			}
		}
	}
	go func() {
		defer close(ended)
		for {
			select {
			case <-p.wake:
				send()
			case <-quit:
				send()
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		close(quit)
		<-ended
	}
}
