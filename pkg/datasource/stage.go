package datasource

import (
	"bufio"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

const copyBufSize = 1 << 20

var bufPool = sync.Pool{New: func() any { b := alignedBuf(copyBufSize); return &b }}

var (
	md5ETag       = regexp.MustCompile(`^[0-9a-f]{32}$`)
	multipartETag = regexp.MustCompile(`^[0-9a-f]{32}-([0-9]+)$`)
)

// job stages one dataset into one pool's cache. Memory stays bounded whatever the dataset size:
// the manifest is streamed from disk, and each worker holds one copy buffer.
type job struct {
	m    *Manager
	req  Request
	id   string // req.Spec.ID(), which hashes the spec
	pool string
	dir  string
	src  source.Source
	root *os.Root // dir; every write goes through it, so no path can leave the dataset

	phase                                      atomic.Value
	bytesDone, bytesTotal, objsDone, objsTotal atomic.Int64
	alloc                                      atomic.Int64
	// listed is closed once the manifest is taken: the dataset's size is known.
	listed chan struct{}
	done   chan struct{}
	err    error

	dirs *dirCache
	tmp  [tmpShards]*dir
	// resuming is set when staging/ already held files at start.
	resuming bool
	// principal is the caller whose credentials stage (access.go).
	principal string
	// wanted is when a caller last asked for the dataset (UnixNano); see Limits.AbandonAfter.
	wanted atomic.Int64
	// sourceSlots bound the node's reads from the job's source endpoint.
	sourceSlots chan struct{}
	// md is the committed manifest's meta, set before listed is closed.
	md atomic.Pointer[meta]
	// started is when the job was created (the inventory's last use of a new dataset).
	started time.Time

	bigMu sync.Mutex
	big   []*bigFile

	// swarm, when the node has peers, fetches pieces from the nodes that hold them (peerfetch.go);
	// holding is what this job serves them meanwhile.
	swarm   *peer.Swarm
	holding holding
	// deferred are small entries put off while a peer read them (runTask), deferredRanges ranges
	// of large entries.
	deferMu        sync.Mutex
	deferred       []task
	deferredRanges []task
	// canon names the manifest's entries as peers do (peerserve.go); set before swarm.
	canon atomic.Pointer[canon]
}

func newJob(m *Manager, req Request, dir string, src source.Source) *job {
	j := &job{m: m, req: req, id: req.Spec.ID(), pool: req.Pool, dir: dir, src: src, listed: make(chan struct{}), done: make(chan struct{}),
		sourceSlots: m.sourceSlots(req.Spec), started: time.Now()}
	j.phase.Store(PhaseListing)
	j.want()
	return j
}

// want records that a caller asked for the dataset.
func (j *job) want() { j.wanted.Store(time.Now().UnixNano()) }

// isListed reports whether the manifest is taken, so that bytesTotal is the dataset's size.
func (j *job) isListed() bool {
	select {
	case <-j.listed:
		return true
	default:
		return false
	}
}

func (j *job) status() Status {
	st := Status{
		Dataset: j.req.Spec.Source, Phase: j.phase.Load().(Phase),
		BytesDone: j.bytesDone.Load(), BytesTotal: j.bytesTotal.Load(),
		ObjectsDone: j.objsDone.Load(), ObjectsTotal: j.objsTotal.Load(),
	}
	if md := j.md.Load(); md != nil {
		st.Version = md.Digest
	}
	return st
}

// manifestMeta returns the committed manifest's meta and digest; only once listed is closed.
func (j *job) manifestMeta() (*meta, string) {
	md := j.md.Load()
	return md, md.Digest
}

func (j *job) describe() string { return j.req.Spec.describe() }

func (j *job) run(ctx context.Context) (err error) {
	logger := klog.FromContext(ctx)
	ctx, cancelDeadline := context.WithTimeoutCause(ctx, j.m.limits.JobDeadline,
		source.Errorf(source.Retryable, "staging took longer than %s", j.m.limits.JobDeadline))
	defer cancelDeadline()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go j.watchInterest(ctx, cancel)
	defer func() {
		if err == nil {
			return
		}
		if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
			err = cause // the deadline or abandonment, not the read it interrupted
		}
		j.phase.Store(PhaseFailed)
		if errors.Is(err, errAbandoned) || ctx.Err() == nil && source.IsPermanent(err) {
			// Nothing is left behind of a dataset that cannot be staged.
			if rerr := removeAllQuick(j.dir); rerr != nil {
				logger.Error(rerr, "cleaning up failed dataset")
			}
		}
		err = fmt.Errorf("%s: %w", j.describe(), err)
	}()
	// The cache is root's: volumes reach a dataset through bind mounts, never through this path.
	if err := os.MkdirAll(cacheDir(j.pool), 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(j.dir, 0o755); err != nil {
		return err
	}
	if j.root, err = os.OpenRoot(j.dir); err != nil {
		return err
	}
	defer j.root.Close()
	j.dirs = newDirCache(j.root)
	defer j.dirs.close()
	defer j.closeBig()
	// Partial downloads are discarded; files already in staging/ were verified and are kept.
	if err := os.RemoveAll(filepath.Join(j.dir, tmpDir)); err != nil {
		return err
	}
	// A staging/ that already holds files is a resume: each file is checked before fetching.
	if ents, err := os.ReadDir(filepath.Join(j.dir, stagingDir)); err == nil && len(ents) > 0 {
		j.resuming = true
	}
	// Temporary files are spread over shards: one directory taking every create and rename is a
	// point of contention with many small objects.
	for k := range tmpShards {
		if j.tmp[k], err = j.dirs.mkdir(path.Join(tmpDir, strconv.Itoa(k))); err != nil {
			return err
		}
	}
	if err := j.mkdirs(stagingDir); err != nil {
		return err
	}
	if f, err := j.root.OpenFile(lastUsedFile, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
		f.Close()
	}

	listStart := time.Now()
	md, err := j.manifest(ctx)
	if err != nil {
		return err
	}
	logger.V(2).Info("dataset listed", "objects", md.Objects, "bytes", md.Bytes, "duration", time.Since(listStart))
	j.bytesTotal.Store(md.Bytes)
	j.objsTotal.Store(md.Objects)
	j.alloc.Store(md.Alloc)
	if err := checkCapacity(j.req, md.Bytes, md.Alloc, true); err != nil {
		return err
	}
	j.md.Store(md)
	close(j.listed)
	j.m.changed()
	if err := j.m.makeRoom(ctx, j.pool, j.dir, md.Alloc); err != nil {
		return err
	}
	if j.m.cfg.Peers != nil && j.req.Spec.Scheme == SchemeS3 {
		// Named for peers, the staging is served to them as it goes (peerserve.go).
		c, err := buildCanon(j.dir)
		if err != nil {
			return err
		}
		j.canon.Store(c)
		if j.m.cfg.Peers.HasPeers(j.id) {
			// The caller's own credentials read the data before any peer is asked: its listing
			// gave the manifest, and it may read every file of it, as a cache hit proves access
			// (access.go). A caller that may list but not read, or read only some files, gets
			// nothing from peers.
			if err := j.proveBeforePeers(ctx, md); err != nil {
				return err
			}
			j.swarm = j.m.cfg.Peers.Swarm(ctx, j.id, md.Digest)
			defer j.swarm.Close()
			// One round of asking the peers what they hold (bounded by the network's timeout)
			// before the first piece is read.
			select {
			case <-j.swarm.Polled():
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
	}

	j.phase.Store(PhaseFetching)
	stop := j.logProgress(ctx, logger)
	err = j.fetchAll(ctx)
	stop()
	if err != nil {
		return err
	}
	j.phase.Store(PhaseSyncing)
	if err := j.finish(ctx, md); err != nil {
		return err
	}
	j.phase.Store(PhaseReady)
	return nil
}

// proveBeforePeers shows that the job's caller may read every file of its manifest, so that
// bytes peers serve it are bytes it may have; the proof is remembered as a hit's is.
func (j *job) proveBeforePeers(ctx context.Context, md *meta) error {
	err := j.m.readsEvery(ctx, j.src, j.dir, md)
	switch {
	case err == nil:
		j.m.remember(md.Digest, j.principal)
	case source.KindOf(err) == source.Denied:
		j.m.rememberDenial(md.Digest, j.principal, err)
	}
	return err
}

func (j *job) logProgress(ctx context.Context, logger klog.Logger) func() {
	ctx, cancel := context.WithCancel(ctx)
	go wait.PollUntilContextCancel(ctx, 10*time.Second, false, func(context.Context) (bool, error) {
		st := j.status()
		logger.Info("staging progress", "bytesDone", st.BytesDone, "bytesTotal", st.BytesTotal,
			"objectsDone", st.ObjectsDone, "objectsTotal", st.ObjectsTotal)
		return false, nil
	})
	return cancel
}

// manifest returns the committed manifest, listing the source first if there is none yet. The
// listing is the dataset's point in time: reads are pinned to the ETags it records. A manifest
// left by an earlier attempt (perhaps another caller's, before a restart) is kept only when this
// job's caller proves it reads the same data; otherwise what was staged is discarded.
func (j *job) manifest(ctx context.Context) (*meta, error) {
	if manifestExists(j.dir) {
		if md, err := readMeta(j.dir); err == nil {
			err := j.checkResume(ctx, md)
			if err == nil {
				return md, nil
			}
			if !errors.Is(err, errListingDiffers) {
				return nil, err
			}
			klog.FromContext(ctx).Info("discarding a partial staging: the source's listing differs from its manifest")
			if err := j.discard(); err != nil {
				return nil, err
			}
		}
	}
	j.phase.Store(PhaseListing)
	release, err := j.m.listingSlot(ctx, j.req.Spec)
	if err != nil {
		return nil, err
	}
	defer release()
	md := &meta{Spec: j.req.Spec, Created: time.Now().UTC()}
	filter := j.m.limits.filter(j.req.Spec)
	var digest digester
	tmp := filepath.Join(j.dir, objectsFile+".tmp")
	err = writeAtomic(filepath.Join(j.dir, objectsFile), func(f *os.File) error {
		bw := bufio.NewWriterSize(f, 256<<10)
		written := &countingWriter{w: bw}
		enc := json.NewEncoder(written)
		limits := j.m.limits
		var listed int64
		err := j.src.List(ctx, func(o source.Object) error {
			if listed++; listed > limits.MaxObjects {
				return limits.checkListed(listed)
			}
			keep, err := keepEntry(limits, filter, o)
			if err != nil || !keep {
				return err
			}
			md.Objects++
			md.Bytes += o.Size
			md.Alloc += entryAlloc(o)
			j.objsTotal.Store(md.Objects)
			j.bytesTotal.Store(md.Bytes)
			// Refuse as soon as it is known, before any download.
			if err := limits.checkTotals(md.Objects, md.Bytes); err != nil {
				return err
			}
			if err := checkCapacity(j.req, md.Bytes, md.Alloc, false); err != nil {
				return err
			}

			if err := digest.add(o); err != nil {
				return err
			}
			if err := enc.Encode(o); err != nil {
				return err
			}
			if written.n > limits.MaxManifestBytes {
				return source.Errorf(source.TooLarge, "its manifest is larger than %s, the most a dataset may have on this node", humanBytes(limits.MaxManifestBytes))
			}
			return nil
		})
		if err != nil {
			return err
		}
		if err := bw.Flush(); err != nil {
			return err
		}
		md.Digest = digest.sum()
		// meta.json first: objects.jsonl appearing is the commit point.
		return writeMeta(j.dir, md)
	})
	os.Remove(tmp)
	if err != nil {
		return nil, err
	}
	return md, nil
}

// checkResume proves that this job's caller reads the data of the manifest an earlier attempt
// left, as a cache hit does (access.go): its own listing matches, and it may read every file.
func (j *job) checkResume(ctx context.Context, md *meta) error {
	digest, err := manifestDigest(j.dir, md)
	if err != nil {
		return err
	}
	md.Digest = digest
	return j.m.prove(ctx, j.req, j.dir, md, digest)
}

// discard removes what an earlier attempt staged under a manifest this caller cannot use.
func (j *job) discard() error {
	if err := os.Remove(filepath.Join(j.dir, objectsFile)); err != nil && !isNotExist(err) {
		return err
	}
	staging := filepath.Join(j.dir, stagingDir)
	ents, err := os.ReadDir(staging)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(staging, e.Name())); err != nil {
			return err
		}
	}
	j.resuming = false
	return syncDir(j.dir)
}

type task struct {
	i   int64
	obj source.Object
	big *bigFile
	off int64
	n   int64
	idx int
	// deferred is set on a second turn: the piece was put off because a peer was reading it.
	deferred bool
	// batch, when set, are small entries read from a peer in one request (peerbatch.go); the
	// other fields are then empty.
	batch []task
}

// rangesPerObject bounds the parallel ranged reads of one large object: more streams of the
// same object add contention, not throughput (rclone's multi-thread default is 4 too).
const rangesPerObject = 4

// bigFile is a large object read in parallel ranges; the last range to finish verifies it.
type bigFile struct {
	out      *output
	streams  chan struct{}
	left     atomic.Int64
	partSize int64 // >0: ranges are the object's multipart parts, each MD5-checked
	partSums [][]byte
	// crc, when set, checks the object's full-object CRC: one CRC per range, combined.
	crc       *crcAlgo
	crcWant   string
	rangeSums []uint64
	chunk     int64
	closeOnce sync.Once
	// from names, per range, the peers that served it (peerfetch.go).
	from [][]peer.Peer
	// eligible is set when the entry has a checksum from the source that peers' bytes are
	// checked against.
	eligible bool
}

// rangeHash is the digest each range needs for the object's check (nil: none per range).
func (b *bigFile) rangeHash() func() hash.Hash {
	switch {
	case b.crc != nil:
		return b.crc.new
	case b.partSize > 0:
		return md5.New
	}
	return nil
}

func (b *bigFile) setSum(k int, sum []byte) {
	switch {
	case b.crc != nil:
		b.rangeSums[k] = b.crc.sumBytes(sum)
	case b.partSize > 0:
		b.partSums[k] = sum
	}
}

func (j *job) closeBig() {
	j.bigMu.Lock()
	defer j.bigMu.Unlock()
	for _, b := range j.big {
		b.closeOnce.Do(func() { b.out.f.Close() })
	}
}

func (j *job) fetchAll(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	tasks := make(chan task, 2*j.m.cfg.Concurrency)
	var sendEntry func(int64, source.Object) error
	fail := func(err error) {
		if err != nil {
			cancel(err)
		}
	}
	work := func(wg *sync.WaitGroup, tasks <-chan task) {
		for range j.m.cfg.Concurrency {
			wg.Go(func() {
				for t := range tasks {
					if ctx.Err() != nil {
						continue
					}
					fail(j.runTask(ctx, t))
				}
			})
		}
	}
	var wg, againWG sync.WaitGroup
	work(&wg, tasks)
	// Pieces put off while peers read them from the source are taken from those peers as soon
	// as they hold them, while this node reads its own share (peerbatch.go).
	again := make(chan task, 2*j.m.cfg.Concurrency)
	work(&againWG, again)
	stopTaking := func() {}
	if j.swarm != nil {
		tctx, stop := context.WithCancel(ctx)
		taken := make(chan struct{})
		go func() { defer close(taken); j.takeHeld(tctx, ctx, again) }()
		stopTaking = func() { stop(); <-taken }
	}
	each := func(from, to int64) error {
		return eachObject(j.dir, func(i int64, o source.Object) error {
			if i < from || i >= to {
				return nil
			}
			return sendEntry(i, o)
		})
	}
	if j.swarm != nil {
		// With peers, entries go in the order peers name them, each node from its own share
		// (peerfetch.go).
		each = func(from, to int64) error { return j.eachShared(from, to, sendEntry) }
	}
	start := j.readOrder(j.objsTotal.Load(), "entries")
	batches := &batcher{tasks: tasks}
	sendEntry = func(i int64, o source.Object) error {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		switch o.Type {
		case source.Dir:
			j.objsDone.Add(1)
			return j.mkdirs(path.Join(stagingDir, o.Key))
		case source.Symlink:
			return nil // after every file: no write may pass through a link
		}
		if j.resuming && j.staged(o) {
			j.bytesDone.Add(o.Size)
			j.objsDone.Add(1)
			j.holding.commit(j.rank(i))
			return nil
		}
		if o.Size <= 2*j.m.cfg.ChunkSize {
			t := task{i: i, obj: o, n: o.Size}
			if j.batchable(t) {
				return batches.add(ctx, t)
			}
			return send(ctx, tasks, t)
		}
		return j.sendRanges(ctx, tasks, i, o)
	}
	err := each(start, math.MaxInt64)
	if err == nil && start > 0 {
		err = each(0, start)
	}
	if err == nil {
		err = batches.flush(ctx)
	}
	close(tasks)
	wg.Wait()
	stopTaking()
	// Pieces a peer was reading from the source when their turn came, and still is.
	if deferred := j.takeDeferred(); err == nil && ctx.Err() == nil && len(deferred) > 0 {
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

func send(ctx context.Context, tasks chan<- task, t task) error {
	select {
	case tasks <- t:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// staged reports whether a verified copy of o is already in staging/ (resume after a restart).
func (j *job) staged(o source.Object) bool {
	name := path.Join(stagingDir, o.Key)
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

// streamsPerObject bounds the ranges of one object read from the source at once: rangesPerObject
// for a node alone. In a swarm of N nodes each reads its share with rangesPerObject/N streams (at
// least one): the source still sees about rangesPerObject streams for the object, and each node's
// pieces complete one after another, so the others take them while the source is still being
// read rather than all at its end.
func (j *job) streamsPerObject() int {
	if j.swarm == nil {
		return rangesPerObject
	}
	return max(1, rangesPerObject/j.swarm.Members())
}

func (j *job) sendRanges(ctx context.Context, tasks chan<- task, i int64, o source.Object) error {
	chunk := j.m.cfg.ChunkSize
	b := &bigFile{streams: make(chan struct{}, j.streamsPerObject())}
	if p, ok := j.src.(source.Planner); ok {
		plan, err := p.Plan(ctx, o)
		if err != nil {
			return err
		}
		if a, ok := crcAlgos[plan.Checksum.Algorithm]; ok {
			// A few long parallel ranges (one per stream, as rclone does): each request has a
			// cost on the server. Each range is CRC'd; the CRCs combine into the object's.
			// Ranges start on MiB boundaries, as direct I/O needs.
			// With peers, ranges stay small: they are what nodes serve each other.
			if j.swarm == nil {
				chunk = max(chunk, ((o.Size+rangesPerObject-1)/rangesPerObject+1<<20-1)&^(1<<20-1))
			}
			b.crc, b.crcWant = &a, plan.Checksum.Value
			b.rangeSums = make([]uint64, (o.Size+chunk-1)/chunk)
		} else if checksumHash(plan.Checksum.Algorithm) != nil {
			// A checksum that cannot be combined (SHA): one read, checked as it streams.
			return send(ctx, tasks, task{i: i, obj: o, n: o.Size})
		}
		if m := multipartETag.FindStringSubmatch(o.ETag); m != nil && plan.PartSize > 0 && b.crc == nil {
			parts, _ := strconv.ParseInt(m[1], 10, 64)
			if (o.Size+plan.PartSize-1)/plan.PartSize == parts {
				chunk, b.partSize = plan.PartSize, plan.PartSize
				b.partSums = make([][]byte, parts)
			}
		}
	}
	f, err := j.dirs.create(j.tmpDir(i), tmpBase(i), os.O_RDWR, fileMode(o))
	if err != nil {
		return err
	}
	// Allocate the whole file first: parallel ranges written into a sparse file fragment it and
	// make writeback slower, and a full pool shows here rather than halfway through.
	if err := unix.Fallocate(int(f.Fd()), 0, 0, o.Size); err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			f.Close()
			return writeErr(err)
		}
		if err := f.Truncate(o.Size); err != nil { // filesystems without fallocate
			f.Close()
			return err
		}
	}
	// Direct I/O when the ranges are block-aligned and verified as they stream (not by reading
	// the file again).
	b.out = newOutput(f, o.Size, o.Size >= directMinSize && chunk%directAlign == 0 && (b.crc != nil || b.partSize > 0))
	j.bigMu.Lock()
	j.big = append(j.big, b)
	j.bigMu.Unlock()
	n := (o.Size + chunk - 1) / chunk
	b.left.Store(n)
	b.chunk = chunk
	b.from = make([][]peer.Peer, n)
	b.eligible = b.crc != nil || b.partSize > 0 || md5ETag.MatchString(o.ETag)
	start := j.readOrder(n, o.Key)
	for r := range n {
		k := (start + r) % n
		off := k * chunk
		if err := send(ctx, tasks, task{i: i, obj: o, big: b, off: off, n: min(chunk, o.Size-off), idx: int(k)}); err != nil {
			return err
		}
	}
	return nil
}

// runTask runs t within the object's stream limit, its source's limit, then the node's
// concurrency limit, in that order, so a task waiting for its object or a slow source never holds
// a node slot.
func (j *job) runTask(ctx context.Context, t task) error {
	if t.batch != nil {
		return j.runBatch(ctx, t.batch)
	}
	// A piece a peer is reading from the source now, or that is another node's share to read,
	// is put off until every other piece had its turn: meanwhile this node reads its own share.
	if !t.deferred && (j.peerBusy(t) || j.othersShare(t)) {
		j.deferTask(t)
		return nil
	}
	// A piece a peer holds does not load the source: it takes no stream of the object's (they
	// bound the ranges read from the source at once) and no slot of the source's.
	held := j.peerHolds(t)
	if t.big != nil && !held {
		select {
		case t.big.streams <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		defer func() { <-t.big.streams }()
	}
	if !held {
		select {
		case j.sourceSlots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		defer func() { <-j.sourceSlots }()
	}
	select {
	case j.m.slots <- struct{}{}:
	case <-ctx.Done():
		return nil
	}
	defer func() { <-j.m.slots }()
	return j.do(ctx, t)
}

const tmpShards = 64

// tmpDir and tmpBase place the temporary file of manifest entry i.
func (j *job) tmpDir(i int64) *dir { return j.tmp[i%tmpShards] }
func tmpBase(i int64) string       { return strconv.FormatInt(i, 10) }

func (j *job) do(ctx context.Context, t task) error {
	if t.big != nil {
		return j.fetchRange(ctx, t)
	}
	var err error
	for attempt := 0; attempt < 3; {
		pr := &pieceRead{i: j.rank(t.i), eligible: md5ETag.MatchString(t.obj.ETag), owner: j.owner(t)}
		if err = j.fetchWhole(ctx, t.i, t.obj, pr); source.KindOf(err) != source.Corrupt {
			break
		}
		if len(pr.peers) > 0 {
			// A peer served a wrong byte: it is dropped, and the entry read again elsewhere.
			for _, p := range pr.peers {
				j.swarm.Wrong(p)
				j.m.metrics.wrongPieces.Inc()
			}
			klog.FromContext(ctx).Info("a peer served bytes that fail verification; dropped it, fetching again",
				"key", t.obj.Key, "peers", peerNodes(pr.peers), "err", err)
			continue
		}
		if attempt++; attempt < 3 {
			klog.FromContext(ctx).Info("verification failed, fetching again", "key", t.obj.Key, "err", err)
		}
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

func (j *job) fetchWhole(ctx context.Context, i int64, o source.Object, pr *pieceRead) error {
	f, err := j.dirs.create(j.tmpDir(i), tmpBase(i), os.O_WRONLY, fileMode(o))
	if err != nil {
		return err
	}
	var newHash func() hash.Hash
	if md5ETag.MatchString(o.ETag) {
		newHash = md5.New
	}
	out := newOutput(f, o.Size, o.Size >= directMinSize)
	verified, sum, err := j.readInto(ctx, o, out, 0, o.Size, newHash, pr)
	if err == nil {
		err = out.finish()
	}
	if err != nil {
		f.Close()
		_ = j.dirs.remove(j.tmpDir(i), tmpBase(i))
		return err
	}
	if !verified && newHash != nil && hex.EncodeToString(sum) != o.ETag {
		err = source.Errorf(source.Corrupt, "%q: MD5 %x does not match ETag %s", o.Key, sum, o.ETag)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = j.src.Verify(ctx, o)
	}
	if err != nil {
		j.bytesDone.Add(-o.Size) // readInto counted what it wrote; it will be fetched again
		_ = j.dirs.remove(j.tmpDir(i), tmpBase(i))
		return err
	}
	return j.commit(i, o)
}

func (j *job) fetchRange(ctx context.Context, t task) error {
	b := t.big
	pr := &pieceRead{i: j.rank(t.i), eligible: b.eligible, owner: j.owner(t)}
	_, sum, err := j.readInto(ctx, t.obj, b.out, t.off, t.n, b.rangeHash(), pr)
	if err != nil {
		return err
	}
	b.setSum(t.idx, sum)
	b.from[t.idx] = pr.peers
	if len(pr.peers) == 0 && j.swarm != nil {
		// Read from the source itself: served to peers before the whole entry is checked (they
		// check it themselves); ranges from peers are served only once it is.
		j.holding.addRange(peer.Range{Index: j.rank(t.i), Off: t.off, N: t.n})
	}
	if b.left.Add(-1) > 0 {
		return nil
	}
	// Last range: verify the whole object. When it fails and peers served ranges of it, those
	// ranges are read again from the source, the peers whose bytes differ dropped, and the
	// object checked again.
	err = j.verifyBig(ctx, t)
	if source.KindOf(err) == source.Corrupt && slices.ContainsFunc(b.from, func(p []peer.Peer) bool { return len(p) > 0 }) {
		klog.FromContext(ctx).Info("an entry with ranges from peers fails verification; reading them again from the source",
			"key", t.obj.Key, "err", err)
		if _, err := j.blame(ctx, t); err != nil {
			return err
		}
		err = j.verifyBig(ctx, t)
	}
	if err != nil {
		return err
	}
	if err := b.out.finish(); err != nil {
		return err
	}
	var cerr error
	b.closeOnce.Do(func() { cerr = b.out.f.Close() })
	if cerr != nil {
		return cerr
	}
	if err := j.src.Verify(ctx, t.obj); err != nil {
		return err
	}
	return j.commit(t.i, t.obj)
}

// verifyBig checks a large object read in ranges against the checksum the source gave for it.
func (j *job) verifyBig(ctx context.Context, t task) error {
	b, o := t.big, t.obj
	switch {
	case b.crc != nil:
		crc := b.rangeSums[0]
		for k := 1; k < len(b.rangeSums); k++ {
			crc = b.crc.combine(crc, b.rangeSums[k], min(b.chunk, o.Size-int64(k)*b.chunk))
		}
		if got := b.crc.encode(crc); got != b.crcWant {
			return source.Errorf(source.Corrupt, "%q: checksum %s does not match %s", o.Key, got, b.crcWant)
		}
	case b.partSize > 0:
		h := md5.New()
		for _, s := range b.partSums {
			h.Write(s)
		}
		if got := fmt.Sprintf("%x-%d", h.Sum(nil), len(b.partSums)); got != o.ETag {
			return source.Errorf(source.Corrupt, "%q: multipart MD5 %s does not match ETag %s", o.Key, got, o.ETag)
		}
	case md5ETag.MatchString(o.ETag):
		h := md5.New()
		if _, err := io.Copy(h, io.NewSectionReader(b.out.f, 0, o.Size)); err != nil {
			return err
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != o.ETag {
			return source.Errorf(source.Corrupt, "%q: MD5 %s does not match ETag %s", o.Key, got, o.ETag)
		}
	}
	return nil
}

// readInto copies [off, off+n) of o into f at off, retrying transient failures with exponential
// backoff and full jitter, resuming where the last attempt stopped. A full read of an object that
// comes with a full-object checksum is checked against it (verified); otherwise, when newHash is
// set, the range's digest is returned for the caller to check. With pr, peers may serve the
// bytes (peerfetch.go); pr records which did.
func (j *job) readInto(ctx context.Context, o source.Object, f *output, off, n int64, newHash func() hash.Hash, pr *pieceRead) (verified bool, sum []byte, err error) {
	var (
		written int64
		h       hash.Hash
		want    source.Checksum
	)
	for attempt := 0; ; {
		var (
			rc  io.ReadCloser
			via *peer.Peer
		)
		actx, cancel := context.WithTimeoutCause(ctx, j.m.limits.readTimeout(n-written), errTooSlow)
		rc, via, err = j.open(actx, pr, o, off+written, n-written)
		piece := peer.Range{Index: -1}
		if err == nil && via == nil && j.swarm != nil && pr != nil {
			// Peers that need this piece wait for it rather than read it from the source too.
			piece = peer.Range{Index: pr.i, Off: off + written, N: n - written}
			j.holding.setBusy(piece, true)
		}
		if err == nil {
			if written == 0 {
				// A resumed read continues the same digest: reads are pinned to the listed
				// version, so the rest of the bytes belong to the checksum of the first.
				want, h = source.Checksum{}, nil
				if c, ok := rc.(source.Checksummed); ok {
					if nh := checksumHash(c.Checksum().Algorithm); nh != nil {
						want, h = c.Checksum(), nh()
					}
				}
				if h == nil && newHash != nil {
					h = newHash()
				}
			}
			var k int64
			k, err = j.copyAt(actx, f, off+written, n-written, rc, h)
			written += k
			rc.Close()
			cancel()
			if piece.Index >= 0 {
				j.holding.setBusy(piece, false)
			}
			origin := originSource
			if via != nil {
				origin = originPeer
				j.swarm.Done(*via, err != nil || k < n-(written-k))
			}
			j.m.metrics.fetchedBytes.WithLabelValues(j.id, origin).Add(float64(k))
			if err == nil && written < n {
				err = source.Errorf(source.Retryable, "%q: short read (%d of %d bytes)", o.Key, written, n)
			}
			if err == nil {
				switch {
				case want.Algorithm != "":
					if got := encodeChecksum(h.Sum(nil)); got != want.Value {
						j.bytesDone.Add(-written)
						return false, nil, source.Errorf(source.Corrupt, "%q: %s checksum %s does not match %s",
							o.Key, want.Algorithm, got, want.Value)
					}
					return true, nil, nil
				case h != nil:
					return false, h.Sum(nil), nil
				}
				return false, nil, nil
			}
		}
		cancel()
		if ctx.Err() != nil {
			return false, nil, context.Cause(ctx)
		}
		if via != nil {
			// A peer that fails, is slow or goes away costs no retry: the next read goes to
			// another peer or the source (the peer is left alone a while).
			klog.FromContext(ctx).V(2).Info("peer read failed", "key", o.Key, "peer", via.Node, "err", err)
			continue
		}
		if errors.Is(context.Cause(actx), errTooSlow) {
			err = source.Wrap(source.Retryable, errTooSlow, "%q", o.Key)
		}
		if attempt++; source.KindOf(err) != source.Retryable || attempt >= j.m.cfg.Retries {
			j.bytesDone.Add(-written)
			return false, nil, err
		}
		j.m.metrics.retries.Inc()
		klog.FromContext(ctx).V(2).Info("retrying read", "key", o.Key, "attempt", attempt+1, "err", err)
		if err := sleepBackoff(ctx, attempt); err != nil {
			j.bytesDone.Add(-written)
			return false, nil, err
		}
	}
}

func sleepBackoff(ctx context.Context, attempt int) error {
	d := min(200*time.Millisecond<<attempt, 10*time.Second)
	d = time.Duration(rand.Int64N(int64(d)) + 1) // full jitter
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// copyAt copies up to n bytes from r to f at off through one pooled buffer, honouring the node's
// bandwidth limit, and counts progress.
func (j *job) copyAt(ctx context.Context, f *output, off, n int64, r io.Reader, h hash.Hash) (int64, error) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var done int64
	for done < n {
		want := min(int64(len(buf)), n-done)
		k, rerr := io.ReadFull(r, buf[:want])
		w, k := f.chunk(buf[:want], k, off+done)
		if k > 0 {
			if j.m.limiter != nil {
				if err := j.m.limiter.WaitN(ctx, k); err != nil {
					return done, err
				}
			}
			if err := f.writeAt(buf[:w], off+done); err != nil {
				return done, err
			}
			if h != nil {
				h.Write(buf[:k])
			}
			done += int64(k)
			j.bytesDone.Add(int64(k))
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			return done, nil
		}
		if rerr != nil {
			return done, rerr
		}
	}
	return done, nil
}

func writeErr(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return source.Wrap(source.NoSpace, err, "pool is full")
	}
	return err
}

func fileMode(o source.Object) os.FileMode {
	if o.Mode&0o777 == 0 {
		return 0o644
	}
	return os.FileMode(o.Mode&0o777) | 0o444 // always readable: volumes are read by any pod user
}

// commit moves a verified file to its place in staging/.
func (j *job) commit(i int64, o source.Object) error {
	dst, err := j.dirs.mkdir(path.Join(stagingDir, path.Dir(o.Key)))
	if err != nil {
		return err
	}
	if err := j.dirs.rename(j.tmpDir(i), tmpBase(i), dst, path.Base(o.Key)); err != nil {
		return conflictErr(o.Key, err)
	}
	j.objsDone.Add(1)
	j.holding.commit(j.rank(i))
	return nil
}

func (j *job) mkdirs(dir string) error {
	_, err := j.dirs.mkdir(dir)
	return err
}

func conflictErr(key string, err error) error {
	if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.EEXIST) {
		return source.Wrap(source.Invalid, err, "entry %q conflicts with another entry (a file and a directory of the same name)", key)
	}
	return writeErr(err)
}

// finish creates symlinks, syncs once and publishes staging/ as tree/.
func (j *job) finish(ctx context.Context, md *meta) error {
	err := eachObject(j.dir, func(_ int64, o source.Object) error {
		if o.Type != source.Symlink {
			return nil
		}
		if err := source.ValidateSymlink(o.Key, o.Target); err != nil {
			return err
		}
		if dir := path.Dir(o.Key); dir != "." {
			if err := j.mkdirs(path.Join(stagingDir, dir)); err != nil {
				return err
			}
		}
		name := path.Join(stagingDir, o.Key)
		if t, err := j.root.Readlink(name); err == nil && t == o.Target {
			j.objsDone.Add(1)
			return nil
		}
		if err := j.root.Symlink(o.Target, name); err != nil {
			return conflictErr(o.Key, err)
		}
		j.objsDone.Add(1)
		return nil
	})
	if err != nil {
		return err
	}
	// One sync for the whole dataset, then the rename that makes it visible.
	d, err := j.root.Open(stagingDir)
	if err != nil {
		return err
	}
	err = unix.Syncfs(int(d.Fd()))
	d.Close()
	if err != nil {
		return err
	}
	if err := j.root.Rename(stagingDir, treeDir); err != nil {
		return err
	}
	if err := syncDir(j.dir); err != nil {
		return err
	}
	_ = os.RemoveAll(filepath.Join(j.dir, tmpDir))
	md.Ready = time.Now().UTC()
	touch(j.dir)
	return writeMeta(j.dir, md)
}

// removeAllQuick hides dir under a trash name first, so a half-deleted dataset is never mistaken
// for one to resume, then deletes it.
func removeAllQuick(dir string) error {
	trash := filepath.Join(filepath.Dir(dir), trashPrefix+filepath.Base(dir)+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	if err := os.Rename(dir, trash); err != nil {
		if isNotExist(err) {
			return nil
		}
		return err
	}
	return os.RemoveAll(trash)
}
