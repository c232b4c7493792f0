package stage

// Large entries, read in parallel ranges and verified once the last range is in: against the
// S3 full-object CRC (one CRC per range, combined), the MD5s of the multipart parts, or the MD5
// ETag.

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource/cache"
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
		partSize, err := j.etagPartSize(ctx, p, o, plan)
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
		if partSize > 0 && b.crc == nil {
			chunk, b.partSize = partSize, partSize
			b.partSums = make([][]byte, (o.Size+partSize-1)/partSize)
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
	// MD5s, or its own MD5 (when the CRC is the check, verifyBig checks these too once a peer
	// served a range). The CRC alone is not: bytes a peer chose can match any CRC.
	b.eligible = b.partSize > 0 || b.etagParts > 0 || md5ETag.MatchString(o.ETag)
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
	checked, err := j.verifyBig(ctx, t)
	if source.KindOf(err) == source.Corrupt && slices.ContainsFunc(b.from, func(p []peer.Peer) bool { return len(p) > 0 }) {
		klog.FromContext(ctx).Info("an entry with ranges from peers fails verification; reading them again from the source",
			"key", t.obj.Key, "err", err)
		if _, err := j.blame(ctx, t); err != nil {
			return err
		}
		checked, err = j.verifyBig(ctx, t)
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
	j.e.cfg.Metrics.verified(checked)
	return nil
}

// verifyBig checks a large object read in ranges against the checksum the source gave for it,
// and says which (Checked*).
func (j *Job) verifyBig(ctx context.Context, t task) (checked string, err error) {
	b, o := t.big, t.obj
	switch {
	case b.crc != nil:
		crc := b.rangeSums[0]
		for k := 1; k < len(b.rangeSums); k++ {
			crc = b.crc.combine(crc, b.rangeSums[k], min(b.chunk, o.Size-int64(k)*b.chunk))
		}
		if got := b.crc.encode(crc); got != b.crcWant {
			return "", source.Errorf(source.Corrupt, "%q: %s checksum %s does not match %s", o.Key,
				strings.ToUpper(b.crcName), got, b.crcWant)
		}
		if slices.ContainsFunc(b.from, func(p []peer.Peer) bool { return len(p) > 0 }) {
			// Bytes a peer chose can match any CRC: they must match the ETag's MD5s too.
			return b.crcName, checkETag(b.out.f, o, b.etagParts)
		}
		return b.crcName, nil
	case b.partSize > 0:
		h := md5.New()
		for _, s := range b.partSums {
			h.Write(s)
		}
		if got := fmt.Sprintf("%x-%d", h.Sum(nil), len(b.partSums)); got != o.ETag {
			return "", source.Errorf(source.Corrupt, "%q: multipart MD5 %s does not match ETag %s", o.Key, got, o.ETag)
		}
		return CheckedMultipartMD5, nil
	case md5ETag.MatchString(o.ETag):
		return CheckedMD5, checkETag(b.out.f, o, 0)
	}
	return CheckedNone, nil
}

// checkETag checks the object's bytes in f against its ETag: its MD5, or, for a multipart
// object of parts of partSize, the MD5 of its parts' MD5s. Through a descriptor of its own: f
// may be written with direct I/O, which a plain read of it cannot use.
func checkETag(f *os.File, o source.Object, partSize int64) error {
	if !md5ETag.MatchString(o.ETag) && partSize == 0 {
		return source.Errorf(source.Corrupt, "%q: no MD5 to check bytes from peers against", o.Key)
	}
	r, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		return err
	}
	defer r.Close()
	multipart := partSize > 0
	if !multipart {
		partSize = o.Size
	}
	var sums []byte // the parts' MD5s, one after another
	for off := int64(0); off < o.Size; off += partSize {
		h := md5.New()
		if _, err := io.Copy(h, io.NewSectionReader(r, off, min(partSize, o.Size-off))); err != nil {
			return err
		}
		sums = h.Sum(sums)
	}
	got := hex.EncodeToString(sums)
	if multipart {
		got = fmt.Sprintf("%x-%d", md5.Sum(sums), len(sums)/md5.Size)
	}
	if got != o.ETag {
		return source.Errorf(source.Corrupt, "%q: MD5 %s does not match ETag %s", o.Key, got, o.ETag)
	}
	return nil
}

// etagPartSize is the part size of o when its multipart ETag can check its parts (their count
// matches), else 0: the plan's, or, for an object its CRC checks, asked only when peers may serve
// ranges of it, which are checked against the parts' MD5s too (a CRC cannot check bytes a peer
// chose).
func (j *Job) etagPartSize(ctx context.Context, p source.Planner, o source.Object, plan source.Plan) (int64, error) {
	m := multipartETag.FindStringSubmatch(o.ETag)
	if m == nil {
		return 0, nil
	}
	partSize := plan.PartSize
	if _, isCRC := crcAlgos[plan.Checksum.Algorithm]; isCRC && j.peers.mayShare() {
		var err error
		if partSize, err = p.PartSize(ctx, o); err != nil {
			return 0, err
		}
	}
	if parts, _ := strconv.ParseInt(m[1], 10, 64); partSize <= 0 || (o.Size+partSize-1)/partSize != parts {
		return 0, nil
	}
	return partSize, nil
}
