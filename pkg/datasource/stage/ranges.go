package stage

// Large entries, read in parallel ranges and verified once the last range is in: against the
// S3 full-object CRC (one CRC per range, combined), the MD5s of the multipart parts (under the
// part size the server reports, or those inferred: verify.go), or the MD5 ETag.

import (
	"context"
	"crypto/md5"
	"errors"
	"hash"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"github.com/cistern-csi/cistern/pkg/datasource/etag"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// rangesPerObject bounds the parallel ranged reads of one large object: more streams of the
// same object add contention, not throughput (rclone's multi-thread default is 4 too).
const rangesPerObject = 4

// bigFile is a large object read in parallel ranges; the last range to finish verifies it.
type bigFile struct {
	out      *output
	streams  *streams
	left     atomic.Int64
	partSize int64 // >0: ranges are the object's multipart parts, each MD5-checked
	// inferred says partSize is not the server's but inferred or recorded: a mismatch may be a
	// wrong part size, not a wrong byte (verify.go).
	inferred bool
	// sizes, when set, are the part sizes inferred for a multipart object, checked in one pass
	// over the file once it is in.
	sizes []int64
	// etagParts, with crc: the object's part size, which ranges from peers are checked by too
	// (the multipart ETag), as a CRC cannot check bytes a peer chose.
	etagParts int64
	partSums  [][]byte
	// crc, when set, checks the object's full-object CRC (crcName): one CRC per range, combined.
	crc       *crcAlgo
	crcName   string
	crcWant   string
	rangeSums []uint64
	chunk     int64
	closeOnce sync.Once
	// from names, per range, the peers that served it (peers.go).
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

func (j *Job) closeBig() {
	j.bigMu.Lock()
	defer j.bigMu.Unlock()
	for _, b := range j.big {
		b.closeOnce.Do(func() { b.out.f.Close() })
	}
}

// streamsPerObject bounds the ranges of one object read from the source at once: rangesPerObject
// for a node alone. In a swarm where N nodes read from the source, this one included, each reads
// its share with rangesPerObject/N streams (at least one): the source still sees about
// rangesPerObject streams for the object, and each node's pieces complete one after another, so
// the others take them while the source is still being read rather than all at its end. Members
// that are done reading leave their streams to those still reading (resizeStreams): otherwise
// the last node's share ends on one stream while the link is idle.
func (j *Job) streamsPerObject() int {
	sw := j.peers.sw()
	if sw == nil {
		return rangesPerObject
	}
	return max(1, rangesPerObject/(1+sw.FetchingPeers()))
}

// streams bounds the ranges of one large entry read from the source at once. The bound may change
// while ranges are read (setStreams): the reads under way go on, and no new one starts until
// fewer than the bound run.
type streams struct {
	mu          sync.Mutex
	limit, used int
	changed     chan struct{} // closed, and replaced, when a read ends or the bound changes
}

func newStreams(limit int) *streams { return &streams{limit: limit, changed: make(chan struct{})} }

// acquire waits for a stream; false when ctx ended first.
func (s *streams) acquire(ctx context.Context) bool {
	for {
		s.mu.Lock()
		if s.used < s.limit {
			s.used++
			s.mu.Unlock()
			return true
		}
		changed := s.changed
		s.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}

func (s *streams) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.used--
	s.broadcast()
}

func (s *streams) setLimit(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n != s.limit { // set again after every poll round: wake the waiters only for a change
		s.limit = n
		s.broadcast()
	}
}

func (s *streams) broadcast() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// sendRanges sends the ranges of large entry i; preferred ones (a streaming read waits) are not
// put off for peers.
func (j *Job) sendRanges(ctx context.Context, tasks chan<- task, i int64, o source.Object, preferred bool) error {
	chunk := j.e.cfg.ChunkSize
	b := &bigFile{streams: newStreams(j.streamsPerObject())}
	if p, ok := j.src.(source.Planner); ok {
		plan, err := p.Plan(ctx, o)
		if err != nil {
			return err
		}
		partSize, sizes, inferred, err := j.partCheck(ctx, p, o, plan)
		if err != nil {
			return err
		}
		if a, isCRC := crcAlgos[plan.Checksum.Algorithm]; isCRC {
			// A few long parallel ranges (one per stream, as rclone does): each request has a
			// cost on the server. Each range is CRC'd; the CRCs combine into the object's.
			// Ranges start on MiB boundaries, as direct I/O needs.
			// Shared with peers, ranges stay small: they are what nodes serve each other, also
			// to nodes that learn of this one while it fetches.
			if !j.peers.shared() {
				chunk = max(chunk, ((o.Size+rangesPerObject-1)/rangesPerObject+1<<20-1)&^(1<<20-1))
			}
			b.crc, b.crcName, b.crcWant = &a, strings.ToLower(plan.Checksum.Algorithm), plan.Checksum.Value
			b.rangeSums = make([]uint64, (o.Size+chunk-1)/chunk)
			b.etagParts = partSize // what bytes from peers are checked against too
		} else if checksumHash(plan.Checksum.Algorithm) != nil {
			// A checksum that cannot be combined (SHA): one read, checked as it streams.
			return send(ctx, tasks, task{i: i, obj: o, n: o.Size, deferred: preferred})
		}
		if b.crc == nil {
			if chunk, err = j.checkByETag(ctx, b, o, chunk, partSize, sizes, inferred); err != nil {
				return err
			}
		}
	}
	f, err := j.dirs.create(j.tmpDirOf(i), tmpBase(i), os.O_RDWR, fileMode(o))
	if err != nil {
		return err
	}
	// Allocate the whole file first: parallel ranges written into a sparse file fragment it and
	// make writeback slower, and a full pool shows here rather than halfway through.
	if err := unix.Fallocate(int(f.Fd()), 0, 0, o.Size); err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			f.Close()
			return cache.WriteErr(err)
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
	// Peers may serve ranges of an object checked by a digest a peer cannot forge: its parts'
	// MD5s (under the server's part size or inferred ones), or its own MD5 (when the CRC is the
	// check, verifyBig checks these too once a peer served a range). The CRC alone is not: bytes
	// a peer chose can match any CRC. Nor is nothing (an unverifiable object served).
	b.eligible = b.partSize > 0 || b.etagParts > 0 || len(b.sizes) > 0 || etag.IsMD5(o.ETag)
	start := j.peers.readOrder(n, o.Key)
	for r := range n {
		k := (start + r) % n
		off := k * chunk
		if err := send(ctx, tasks, task{i: i, obj: o, big: b, off: off, n: min(chunk, o.Size-off), idx: int(k), deferred: preferred}); err != nil {
			return err
		}
	}
	return nil
}

// checkByETag sets b, a large entry o without a CRC, to be checked by its ETag (partCheck's
// partSize, sizes, inferred), and returns its ranges' size: its part size when one is known.
func (j *Job) checkByETag(ctx context.Context, b *bigFile, o source.Object, chunk, partSize int64, sizes []int64, inferred bool) (int64, error) {
	switch {
	case partSize > 0:
		b.partSize, b.inferred = partSize, inferred
		b.partSums = make([][]byte, (o.Size+partSize-1)/partSize)
		return partSize, nil
	case len(sizes) > 0:
		b.sizes = sizes
	case !etag.IsMD5(o.ETag):
		// Nothing checks it: refused before any byte is read, or served unchecked.
		return chunk, j.unverifiable(ctx, o, uncheckable(o))
	}
	return chunk, nil
}

func (j *Job) fetchRange(ctx context.Context, t task) error {
	b := t.big
	pr := &pieceRead{i: j.peers.rank(t.i), eligible: b.eligible, owner: j.peers.owner(t)}
	if t.last {
		pr.steal = func() bool { return j.stealable(t, pr.owner) }
	}
	_, sum, err := j.readInto(ctx, t.obj, b.out, t.off, t.n, b.rangeHash(), pr)
	if err != nil {
		return err
	}
	b.setSum(t.idx, sum)
	b.from[t.idx] = pr.peers
	if len(pr.peers) == 0 && j.peers.shared() {
		// Read from the source itself: served to peers before the whole entry is checked (they
		// check it themselves); ranges from peers are served only once it is.
		j.peers.holding.AddRange(peer.Range{Index: j.peers.rank(t.i), Off: t.off, N: t.n})
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
	if errors.Is(err, errNoSizeMatches) {
		// No inferred part size matches: read it all again from the source, so that bytes
		// damaged on the way are not taken for an unusual part size.
		klog.FromContext(ctx).Info("an entry matches under none of its likely part sizes; reading it again from the source",
			"key", t.obj.Key, "err", err)
		if err = j.reread(ctx, t); err == nil {
			if err = j.verifyBig(ctx, t); errors.Is(err, errNoSizeMatches) {
				err = j.sizeUnverifiable(ctx, t.obj, err)
			}
		}
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
	if err := j.commit(t.i, t.obj); err != nil {
		return err
	}
	j.e.cfg.Metrics.verified(b.checkedBy(t.obj))
	return nil
}

// checkedBy names what verifyBig checked o's bytes against (Checked*, or the CRC's name).
func (b *bigFile) checkedBy(o source.Object) string {
	switch {
	case b.crc != nil:
		return b.crcName
	case b.partSize > 0, len(b.sizes) > 0:
		return CheckedMultipartMD5
	case etag.IsMD5(o.ETag):
		return CheckedMD5
	}
	return CheckedNone
}

// reread reads every range of large entry t again from the source.
func (j *Job) reread(ctx context.Context, t task) error {
	b := t.big
	for k := range b.from {
		off := int64(k) * b.chunk
		n := min(b.chunk, t.obj.Size-off)
		_, sum, err := j.readInto(ctx, t.obj, b.out, off, n, b.rangeHash(), nil)
		if err != nil {
			return err
		}
		j.bytesDone.Add(-n) // counted once already
		b.setSum(k, sum)
		b.from[k] = nil
	}
	return nil
}

// verifyBig checks a large object read in ranges against the checksum the source gave for it.
func (j *Job) verifyBig(ctx context.Context, t task) error {
	b, o := t.big, t.obj
	fromPeers := slices.ContainsFunc(b.from, func(p []peer.Peer) bool { return len(p) > 0 })
	switch {
	case b.crc != nil:
		crc := b.rangeSums[0]
		for k := 1; k < len(b.rangeSums); k++ {
			crc = b.crc.combine(crc, b.rangeSums[k], min(b.chunk, o.Size-int64(k)*b.chunk))
		}
		if got := b.crc.encode(crc); got != b.crcWant {
			return source.Errorf(source.Corrupt, "%q: %s checksum %s does not match %s", o.Key,
				strings.ToUpper(b.crcName), got, b.crcWant)
		}
		if fromPeers {
			// Bytes a peer chose can match any CRC: they must match the ETag's MD5s too.
			var sizes []int64
			if b.etagParts > 0 {
				sizes = []int64{b.etagParts}
			}
			_, err := checkETag(b.out.f, o, sizes)
			return err
		}
	case b.partSize > 0:
		if got := etag.Of(slices.Concat(b.partSums...)); got != o.ETag {
			if b.inferred {
				return noSizeMatches(o, []int64{b.partSize})
			}
			return source.Errorf(source.Corrupt, "%q: multipart MD5 %s does not match ETag %s", o.Key, got, o.ETag)
		}
	case len(b.sizes) > 0:
		if _, err := checkETag(b.out.f, o, b.sizes); source.KindOf(err) == source.Corrupt {
			return noSizeMatches(o, b.sizes)
		} else if err != nil {
			return err
		}
	case etag.IsMD5(o.ETag):
		_, err := checkETag(b.out.f, o, nil)
		return err
	}
	return nil
}
