package stage

// Batches: a node that reads many small entries from peers asks a peer for up to batchPieces of
// them in one request (package peer, protocol.go) rather than one HTTPS request per entry, which
// cost both ends CPU: 20,000 × 32 KiB from Ready peers took a late node 0.56-0.90 of the time
// alone from S3 (docs/benchmarks.md, "Peer fan-out"). Each entry of a batch is written to tmp/,
// checked against its MD5 ETag and committed on its own, exactly as one read alone; an entry
// that fails drops the peer, and it and the rest of the batch are read as single pieces (another
// peer, or the source).

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"io"
	"os"

	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

const (
	// batchPieces and batchBytes bound one batch: a few requests in flight keep every peer's
	// upload slots busy, and a batch cut short costs little to read again.
	batchPieces = 128
	batchBytes  = 4 << 20
	// batchEntry is the largest entry read in a batch: larger ones cost little per request.
	batchEntry = 1 << 20
)

// batcher gathers batchable tasks into batch tasks.
type batcher struct {
	tasks   chan<- task
	pending []task
	bytes   int64
}

func (b *batcher) add(ctx context.Context, t task) error {
	b.pending = append(b.pending, t)
	if b.bytes += t.obj.Size; len(b.pending) >= batchPieces || b.bytes >= batchBytes {
		return b.flush(ctx)
	}
	return nil
}

func (b *batcher) flush(ctx context.Context) error {
	if len(b.pending) == 0 {
		return nil
	}
	t := task{batch: b.pending}
	b.pending, b.bytes = nil, 0
	return send(ctx, b.tasks, t)
}

// takeHeld sends, after each poll of the peers until ctx ends, the ranges of large entries put
// off (runTask) that a peer holds by now, so that nodes staging together copy each other's
// ranges while they read their own from the source (4 nodes, 2 GiB: all Ready in 1.18 of the time
// of one node alone, not 1.84 with the copies after); and, once this node has read its own
// share, one range a round that it reads from the source in its owner's place (stealsNow).
// Small entries wait for the end
// (sendDeferred): checking thousands of them at each poll cost 8 nodes a third more CPU on a set
// of small files that is CPU-bound anyway. Sends end only with the job (jobCtx): a range taken is
// never lost.
func (j *Job) takeHeld(ctx, jobCtx context.Context, tasks chan<- task) {
	for {
		select {
		case <-j.peers.sw().Polled():
		case <-ctx.Done():
			return
		}
		j.peers.deferMu.Lock()
		var held, rest []task
		stole := false
		for _, t := range j.peers.deferredRanges {
			switch {
			case j.peers.holds(t):
				held = append(held, t)
			case !stole && j.stealsNow(t):
				// One a round: by the next, its owner knows this node reads it.
				t.last, stole = true, true
				held = append(held, t)
			default:
				rest = append(rest, t)
			}
		}
		j.peers.deferredRanges = rest
		j.peers.deferMu.Unlock()
		for _, t := range held {
			t.deferred = true
			if send(jobCtx, tasks, t) != nil {
				return
			}
		}
	}
}

// sendDeferred sends the pieces put off while peers read them (runTask): small entries a peer
// holds by now in batches; those a peer is still reading, and ranges their owner will read
// before this node could (waitsForOwner), after another poll (up to maxWaits); the rest one by
// one, as before.
func (j *Job) sendDeferred(ctx context.Context, tasks chan<- task, ts []task) error {
	b := &batcher{tasks: tasks}
	for waits := 0; len(ts) > 0; waits++ {
		var later []task
		for _, t := range ts {
			t.deferred, t.last = true, true
			switch {
			case j.peers.batchable(t):
				if err := b.add(ctx, t); err != nil {
					return err
				}
			case waits < maxWaits && j.peers.batchEligible(t) && j.peers.awaited(t):
				later = append(later, t)
			case waits < maxWaits && j.waitsForOwner(t):
				// Sent now, it would wait for its owner holding one of the entry's streams,
				// which a range this node may read (stealable) then waits for.
				later = append(later, t)
			default:
				if err := send(ctx, tasks, t); err != nil {
					return err
				}
			}
		}
		if err := b.flush(ctx); err != nil {
			return err
		}
		if ts = later; len(ts) > 0 {
			select {
			case <-j.peers.sw().Polled():
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
	}
	return nil
}

// runBatch reads a batch within one node slot (it does not load the source): from the peer that
// holds most of it, then what is left from the peer that holds most of the rest, for as long as
// a peer brings some; then whatever is left one by one.
func (j *Job) runBatch(ctx context.Context, ts []task) error {
	left, err := j.fetchBatches(ctx, ts)
	if err != nil {
		return err
	}
	for _, t := range left {
		t.deferred = true
		if err := j.runTask(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

func (j *Job) fetchBatches(ctx context.Context, ts []task) ([]task, error) {
	select {
	case j.e.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, nil
	}
	defer func() { <-j.e.slots }()
	for len(ts) > 0 {
		left, err := j.fetchBatch(ctx, ts)
		if err != nil || len(left) == len(ts) {
			return left, err
		}
		ts = left
	}
	return nil, nil
}

// fetchBatch reads entries ts from the peer that holds most of them, in one request, and commits
// each that verifies. It returns the entries left to read another way: those the peer did not
// hold, and all from the first one that failed.
func (j *Job) fetchBatch(ctx context.Context, ts []task) ([]task, error) {
	ob, err := j.openBatch(ctx, ts)
	if ob == nil || err != nil {
		return ts, err
	}
	defer ob.close()
	logger := klog.FromContext(ctx)
	p, left := ob.peer, ob.left
	failed, next := false, 0
	for ; next < len(ob.asked); next++ {
		t := ob.asked[next]
		r, ok, err := ob.Next()
		if err != nil {
			logger.V(2).Info("peer batch failed", "peer", p.Node, "err", err)
			failed = true
			break
		}
		if !ok {
			left = append(left, t)
			continue
		}
		if err = j.fetchFrom(ob.ctx, t.i, t.obj, r); err == nil {
			continue
		}
		if ctx.Err() != nil {
			j.peers.sw().Done(p, true)
			return nil, context.Cause(ctx)
		}
		if source.KindOf(err) == source.Corrupt {
			// A peer served a wrong byte: it is dropped, and the rest read elsewhere.
			j.peers.sw().Wrong(p)
			j.e.cfg.Metrics.WrongPieces.Inc()
			logger.Info("a peer served bytes that fail verification; dropped it, fetching again",
				"key", t.obj.Key, "peers", []string{p.Node}, "err", err)
		} else {
			// A short read, a slow peer, or a local failure that the read alone reports.
			logger.V(2).Info("peer batch failed", "peer", p.Node, "key", t.obj.Key, "err", err)
			failed = true
		}
		break
	}
	j.peers.sw().Done(p, failed)
	// From the entry that failed on, the batch is read another way.
	return append(left, ob.asked[next:]...), nil
}

// openedBatch is a batch request a peer answers: the entries asked of it, those left for others.
type openedBatch struct {
	*peer.Batch
	peer        peer.Peer
	asked, left []task
	// ctx bounds the read by the node's minimum throughput.
	ctx    context.Context
	cancel context.CancelFunc
}

func (ob *openedBatch) close() {
	ob.Close()
	ob.cancel()
}

// openBatch asks the peer that holds most of ts for them; nil when no peer will.
func (j *Job) openBatch(ctx context.Context, ts []task) (*openedBatch, error) {
	pieces := make([]peer.Range, len(ts))
	for k, t := range ts {
		pieces[k] = peer.Range{Index: j.peers.rank(t.i), N: t.obj.Size}
	}
	for waits := 0; ; {
		p, held, choice := j.peers.sw().PickBatch(pieces)
		if choice == peer.Wait && waits < maxWaits {
			// The peers that hold them send all they may at once: ask again after a poll.
			waits++
			select {
			case <-j.peers.sw().Polled():
				continue
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		}
		if choice != peer.FromPeer {
			return nil, nil
		}
		ob := &openedBatch{peer: p}
		var (
			ask   []peer.Range
			total int64
		)
		for n, t := range ts {
			if held[n] {
				ask, ob.asked, total = append(ask, pieces[n]), append(ob.asked, t), total+t.obj.Size
			} else {
				ob.left = append(ob.left, t)
			}
		}
		ob.ctx, ob.cancel = context.WithTimeoutCause(ctx, j.e.cfg.Limits.ReadTimeout(total), errTooSlow)
		var err error
		if ob.Batch, err = j.peers.sw().OpenBatch(ob.ctx, p, ask); err == nil {
			return ob, nil
		}
		ob.cancel()
		switch {
		case ctx.Err() != nil:
			j.peers.sw().Done(p, true)
			return nil, context.Cause(ctx)
		case peer.IsBusy(err):
			j.peers.sw().Refused(p)
		default:
			// Left alone a while: the next pick is another peer, or none.
			klog.FromContext(ctx).V(2).Info("peer batch failed", "peer", p.Node, "err", err)
			j.peers.sw().Done(p, true)
		}
	}
}

// fetchFrom writes entry i, read from a peer through r, into tmp/, checks it against its MD5
// ETag and commits it (fetchWhole, with the bytes already on their way).
func (j *Job) fetchFrom(ctx context.Context, i int64, o source.Object, r io.Reader) error {
	f, err := j.dirs.create(j.tmpDirOf(i), tmpBase(i), os.O_WRONLY, fileMode(o))
	if err != nil {
		return err
	}
	h := md5.New()
	out := newOutput(f, o.Size, false)
	k, err := j.copyAt(ctx, out, 0, o.Size, r, h)
	j.e.cfg.Metrics.Fetched.WithLabelValues(j.id, OriginPeer).Add(float64(k))
	if err == nil && k < o.Size {
		err = source.Errorf(source.Retryable, "%q: short read from a peer (%d of %d bytes)", o.Key, k, o.Size)
	}
	if err == nil {
		err = out.finish()
	}
	if got := hex.EncodeToString(h.Sum(nil)); err == nil && got != o.ETag {
		err = source.Errorf(source.Corrupt, "%q: MD5 %s does not match ETag %s", o.Key, got, o.ETag)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = j.src.Verify(ctx, o)
	}
	if err != nil {
		j.bytesDone.Add(-k)
		_ = j.dirs.remove(j.tmpDirOf(i), tmpBase(i))
		return err
	}
	return j.commit(i, o)
}
