package stage

// Fetching: every entry of the manifest becomes a task (a whole entry, a batch of small ones
// from a peer, or a range of a large one) that the node's workers run within its limits.

import (
	"context"
	"errors"
	"math"
	"os"
	"path"
	"strconv"
	"sync"

	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

type task struct {
	i   int64
	obj source.Object
	big *bigFile
	off int64
	n   int64
	idx int
	// deferred is set on a second turn: the piece was put off because a peer was reading it.
	deferred bool
	// last is set on a range this node may read from the source in its owner's place
	// (stealable): on the turn after every other piece had its own (sendDeferred), or once the
	// node's own share is read (takeHeld).
	last bool
	// batch, when set, are small entries read from a peer in one request (batch.go); the
	// other fields are then empty.
	batch []task
}

func (j *Job) fetchAll(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg, againWG sync.WaitGroup
	// Entries streaming reads wait for (prefer.go) go before the manifest's order.
	first := make(chan task)
	tasks := j.workers(ctx, cancel, &wg, first)
	// Pieces put off while peers read them from the source are taken from those peers as soon
	// as they hold them, while this node reads its own share (batch.go).
	again := j.workers(ctx, cancel, &againWG, nil)
	stopTaking := func() {}
	if j.peers.joined != nil {
		tctx, stop := context.WithCancel(ctx)
		taken := make(chan struct{})
		go func() {
			defer close(taken)
			select { // the swarm may be joined while the job fetches (watchPeers)
			case <-j.peers.joined:
				j.takeHeld(tctx, ctx, again)
			case <-tctx.Done():
			}
		}()
		stopTaking = func() { stop(); <-taken }
	}
	stopPreferred := j.sendPreferred(ctx, cancel, first)
	err := j.sendEntries(ctx, tasks)
	stopPreferred()
	close(tasks)
	wg.Wait()
	stopTaking()
	// Pieces a peer was reading from the source when their turn came, and still is.
	if deferred := j.peers.takeDeferred(); err == nil && ctx.Err() == nil && len(deferred) > 0 {
		err = j.sendDeferred(ctx, again, deferred)
	}
	close(again)
	againWG.Wait()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	if err != nil {
		return err
	}
	return ctx.Err()
}

// workers starts the node's concurrency of workers on a new task channel, each taking a task
// of first (nil: none) before any of the channel's; the first failure cancels ctx, and the rest
// of the tasks are drained. The workers end once the channel is closed and drained.
func (j *Job) workers(ctx context.Context, cancel context.CancelCauseFunc, wg *sync.WaitGroup, first <-chan task) chan<- task {
	tasks := make(chan task, 2*j.e.cfg.Concurrency)
	next := func() (t task, ok bool) {
		select {
		case t = <-first:
			return t, true
		default:
		}
		select {
		case t = <-first:
			return t, true
		case t, ok = <-tasks:
			return t, ok
		}
	}
	for range j.e.cfg.Concurrency {
		wg.Go(func() {
			for t, ok := next(); ok; t, ok = next() {
				if ctx.Err() != nil {
					continue
				}
				if err := j.runTask(ctx, t); err != nil {
					cancel(err)
				}
			}
		})
	}
	return tasks
}

// sendEntries sends a task for every entry of the manifest, from this node's place in the
// reading order (peers.go) round to it.
func (j *Job) sendEntries(ctx context.Context, tasks chan<- task) error {
	batches := &batcher{tasks: tasks}
	sendEntry := func(i int64, o source.Object) error { return j.sendEntry(ctx, tasks, batches, i, o) }
	each := func(from, to int64) error {
		return cache.EachObject(j.dir, func(i int64, o source.Object) error {
			if i < from || i >= to {
				return nil
			}
			return sendEntry(i, o)
		})
	}
	if j.peers.sw() != nil {
		// With peers, entries go in the order peers name them, each node from its own share
		// (peers.go).
		each = func(from, to int64) error { return j.eachShared(from, to, sendEntry) }
	}
	start := j.peers.readOrder(j.objsTotal.Load(), "entries")
	err := each(start, math.MaxInt64)
	if err == nil && start > 0 {
		err = each(0, start)
	}
	if err == nil {
		err = batches.flush(ctx)
	}
	return err
}

// sendEntry makes entry i's directory, or sends the task that fetches it: whole, in a batch
// from a peer, or in ranges. A file already staged (a resume) is counted, and links wait for
// every file. An entry already sent is skipped: each is sent once, in the manifest's order or
// preferred by a streaming read (batches nil: never batched, nor put off for peers).
func (j *Job) sendEntry(ctx context.Context, tasks chan<- task, batches *batcher, i int64, o source.Object) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if !j.prefer.take(i) {
		return nil
	}
	switch o.Type {
	case source.Dir:
		j.objsDone.Add(1)
		j.prefer.committed(i)
		return j.mkdirs(path.Join(cache.StagingDir, o.Key))
	case source.Symlink:
		return nil // after every file: no write may pass through a link
	}
	if j.resuming && j.staged(o) {
		j.bytesDone.Add(o.Size)
		j.objsDone.Add(1)
		j.peers.holding.Commit(j.peers.rank(i))
		j.prefer.committed(i)
		return nil
	}
	preferred := batches == nil
	if o.Size <= 2*j.e.cfg.ChunkSize {
		t := task{i: i, obj: o, n: o.Size, deferred: preferred}
		if !preferred && j.peers.batchable(t) {
			return batches.add(ctx, t)
		}
		return send(ctx, tasks, t)
	}
	return j.sendRanges(ctx, tasks, i, o, preferred)
}

func send(ctx context.Context, tasks chan<- task, t task) error {
	select {
	case tasks <- t:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// staged reports whether a verified copy of o is already in staging/ (resume after a restart).
func (j *Job) staged(o source.Object) bool {
	name := path.Join(cache.StagingDir, o.Key)
	fi, err := j.root.Lstat(name)
	if err != nil {
		return false
	}
	if fi.Mode().IsRegular() && fi.Size() == o.Size {
		return true
	}
	_ = j.root.RemoveAll(name)
	return false
}

// runTask runs t within the object's stream limit, its source's limit, then the node's
// concurrency limit, in that order, so a task waiting for its object or a slow source never holds
// a node slot.
func (j *Job) runTask(ctx context.Context, t task) error {
	if t.batch != nil {
		return j.runBatch(ctx, t.batch)
	}
	if j.putOff(t) {
		return nil
	}
	// A piece a peer holds does not load the source: it takes no stream of the object's (they
	// bound the ranges read from the source at once) and no slot of the source's.
	if !j.peers.holds(t) {
		release, ok := j.sourceTurn(ctx, t)
		if !ok {
			return nil
		}
		// The job may have joined its swarm while the task waited for its turn: a node's first
		// tasks wait for streams before it knows its peers. Read from the source after all, a
		// piece of another node's share held a stream (and waited in open for its owner) while
		// this node's own share waited: 2 GiB × 4 nodes, two nodes read 134 and 268 MB of
		// their 512 MB shares and the others the rest (docs/benchmarks.md, "Peer fan-out").
		if j.putOff(t) {
			release()
			return nil
		}
		// A peer may have come to hold the piece meanwhile. Read from it with the stream held,
		// the node's own share waited behind reads from peers: 2 GiB × 4 nodes, a node's
		// last own range started 1.8 s after the one before while up to four ranges of others'
		// shares came from peers on its streams, and everyone waited for that range.
		if j.peers.holds(t) {
			release()
		} else {
			defer release()
		}
	}
	select {
	case j.e.slots <- struct{}{}:
	case <-ctx.Done():
		return nil
	}
	defer func() { <-j.e.slots }()
	return j.do(ctx, t)
}

// putOff puts t off until every other piece had its turn when a peer is reading its piece from
// the source now, or it is another node's share to read: meanwhile this node reads its own share.
func (j *Job) putOff(t task) bool {
	if t.deferred || !j.peers.busy(t) && !j.peers.othersShare(t) {
		return false
	}
	j.peers.deferTask(t)
	return true
}

// sourceTurn takes a stream of t's object (a range of a large one) and a slot of the source's;
// ok is false when ctx ended first.
func (j *Job) sourceTurn(ctx context.Context, t task) (release func(), ok bool) {
	if t.big != nil && !t.big.streams.acquire(ctx) {
		return nil, false
	}
	releaseStream := func() {
		if t.big != nil {
			t.big.streams.release()
		}
	}
	select {
	case j.sourceSlots <- struct{}{}:
	case <-ctx.Done():
		releaseStream()
		return nil, false
	}
	return func() { <-j.sourceSlots; releaseStream() }, true
}

// tmpDirOf and tmpBase place the temporary file of manifest entry i.
func (j *Job) tmpDirOf(i int64) *dir { return j.tmp[i%cache.TmpShards] }
func tmpBase(i int64) string         { return strconv.FormatInt(i, 10) }

func (j *Job) do(ctx context.Context, t task) error {
	if t.big != nil {
		return j.fetchRange(ctx, t)
	}
	var err error
	fromPeers := checkableWhole(t.obj)
	for attempt := 0; attempt < 3; {
		pr := &pieceRead{i: j.peers.rank(t.i), eligible: fromPeers, owner: j.peers.owner(t)}
		if err = j.fetchWhole(ctx, t.i, t.obj, pr); source.KindOf(err) != source.Corrupt {
			break
		}
		if len(pr.peers) > 0 && errors.Is(err, errNoSizeMatches) {
			// An honest peer's bytes of an object of an unusual part size match under no
			// likely part size either: the peer is not blamed, the entry is read from the
			// source.
			fromPeers = false
			continue
		}
		if len(pr.peers) > 0 {
			// A peer served a wrong byte: it is dropped, and the entry read again elsewhere.
			for _, p := range pr.peers {
				j.peers.sw().Wrong(p)
				j.e.cfg.Metrics.WrongPieces.Inc()
			}
			klog.FromContext(ctx).Info("a peer served bytes that fail verification; dropped it, fetching again",
				"key", t.obj.Key, "peers", peerNodes(pr.peers), "err", err)
			continue
		}
		if attempt++; attempt < 3 {
			klog.FromContext(ctx).Info("verification failed, fetching again", "key", t.obj.Key, "err", err)
		}
	}
	if errors.Is(err, errNoSizeMatches) {
		return j.sizeUnverifiable(ctx, t.obj, err)
	}
	return err
}

func peerNodes(ps []peer.Peer) []string {
	out := make([]string, len(ps))
	for k, p := range ps {
		out[k] = p.Node
	}
	return out
}

func (j *Job) fetchWhole(ctx context.Context, i int64, o source.Object, pr *pieceRead) error {
	f, err := j.dirs.create(j.tmpDirOf(i), tmpBase(i), os.O_WRONLY, fileMode(o))
	if err != nil {
		return err
	}
	newHash, sizes := wholeCheck(o)
	out := newOutput(f, o.Size, o.Size >= directMinSize)
	checked, sum, err := j.readInto(ctx, o, out, 0, o.Size, newHash, pr)
	if err == nil {
		err = out.finish()
	}
	if err != nil {
		f.Close()
		_ = j.dirs.remove(j.tmpDirOf(i), tmpBase(i))
		return err
	}
	switch {
	case checked != "":
	case newHash != nil:
		checked = CheckedMD5
		if len(sizes) > 0 {
			checked = CheckedMultipartMD5
		}
		err = checkWhole(o, sum, sizes)
	case o.ETag != "": // an S3 object nothing checks (other sources have no ETag)
		checked = CheckedNone
		err = j.unverifiable(ctx, o, uncheckable(o))
	default:
		checked = CheckedNone
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = j.src.Verify(ctx, o)
	}
	if err != nil {
		j.bytesDone.Add(-o.Size) // readInto counted what it wrote; it will be fetched again
		_ = j.dirs.remove(j.tmpDirOf(i), tmpBase(i))
		return err
	}
	if err := j.commit(i, o); err != nil {
		return err
	}
	j.e.cfg.Metrics.verified(checked)
	return nil
}
