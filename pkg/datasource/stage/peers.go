package stage

// Peer fan-out, the fetching side (package peer, docs/datasets.md): a staging job reads pieces
// from peers before the source, nodes staging together share the pieces out, and what comes from
// a peer is checked as what comes from the source.
//
// What a fetcher takes from a peer it checks against what the source said, with the caller's own
// credentials: a whole entry against its MD5 ETag from the listing; a large entry, read in
// ranges, against its multipart ETag (parts aligned with the part size HEAD gave) or its MD5
// ETag, over the whole entry before it leaves tmp/; an entry checked by its S3 full-object CRC
// is checked against its ETag too once a peer served a range (bytes a peer chose can match any
// CRC). S3 has no
// usable checksum per range of an object uploaded without part checksums, so a range is not
// checked alone: when a large entry fails, every range a peer served is read again from the
// source, and each peer whose bytes differ is dropped. An entry with none of these checksums
// (an SSE-KMS ETag, a CRC or SHA-256 full-object checksum only) is read from the source alone.

import (
	"context"
	"hash/crc32"
	"io"
	"path/filepath"

	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// pieceRead is one read of a piece (an entry, or a range of one) in a job that fetches from
// peers: which entry, whether peers may serve it, and which did.
type pieceRead struct {
	i        int64
	eligible bool
	// owner is the node whose share the piece is (peer.Swarm.Owner).
	owner string
	peers []peer.Peer
	waits int
	// steal, when set, reports whether the piece, another node's share that it still reads
	// from the source, is better read from the source now than waited for (stealable).
	steal func() bool
}

// maxWaits bounds the poll rounds a fetcher waits for a piece that a peer is reading from the
// source before it reads the piece from the source itself.
const maxWaits = 120

// open opens [off, off+n) of o: from a peer that holds it, after waiting for one that is reading
// it, or from the source. via is the peer, nil for the source.
func (j *Job) open(ctx context.Context, pr *pieceRead, o source.Object, off, n int64) (rc io.ReadCloser, via *peer.Peer, err error) {
	if j.peers.sw() != nil && pr != nil && pr.eligible {
		for {
			p, choice := j.peers.sw().Pick(pr.i, off, n)
			if choice == peer.FromPeer {
				rc, err := j.peers.sw().Open(ctx, p, pr.i, off, n)
				if err == nil {
					pr.peers = append(pr.peers, p)
					return rc, &p, nil
				}
				if !peer.IsBusy(err) {
					j.peers.sw().Done(p, true)
					continue
				}
				// The peer sends all it may at once: ask it, or another, again after a poll
				// rather than read the piece from the source.
				j.peers.sw().Refused(p)
				choice = peer.Wait
			}
			// Another node's share, which it is still reading from the source: wait for it.
			if choice == peer.FromSource && pr.owner != j.peers.self && j.peers.sw().Fetching(pr.owner) &&
				(pr.steal == nil || !pr.steal()) {
				choice = peer.Wait
			}
			if choice == peer.Wait && pr.waits < maxWaits {
				pr.waits++
				select {
				case <-j.peers.sw().Polled():
					continue
				case <-ctx.Done():
					return nil, nil, context.Cause(ctx)
				}
			}
			break
		}
	}
	rc, err = j.src.Open(ctx, o, off, n)
	return rc, nil, err
}

// eachShared calls fn for the manifest's entries of ranks [from, to) in rank order.
func (j *Job) eachShared(from, to int64, fn func(int64, source.Object) error) error {
	return j.peers.names.Load().Each(filepath.Join(j.dir, cache.ObjectsFile), from, to, fn)
}

// blame reads the ranges of a large entry that peers served again from the source, drops each
// peer whose bytes differ, and reports whether any did. The ranges' digests are updated from what
// the source sent.
func (j *Job) blame(ctx context.Context, t task) (bool, error) {
	b := t.big
	// A descriptor of its own: the object's may be open for direct I/O, which needs aligned reads.
	f, err := j.root.Open(cache.TmpName(t.i))
	if err != nil {
		return false, err
	}
	defer f.Close()
	blamed := false
	for k, from := range b.from {
		if len(from) == 0 {
			continue
		}
		off := int64(k) * b.chunk
		n := min(b.chunk, t.obj.Size-off)
		before := crc32.New(castagnoli)
		if _, err := io.Copy(before, io.NewSectionReader(f, off, n)); err != nil {
			return false, err
		}
		_, sum, err := j.readInto(ctx, t.obj, b.out, off, n, b.rangeHash(), nil)
		if err != nil {
			return false, err
		}
		j.bytesDone.Add(-n) // counted once already
		b.setSum(k, sum)
		after := crc32.New(castagnoli)
		if _, err := io.Copy(after, io.NewSectionReader(f, off, n)); err != nil {
			return false, err
		}
		if before.Sum32() != after.Sum32() {
			for _, p := range from {
				j.peers.sw().Wrong(p)
				j.e.cfg.Metrics.WrongPieces.Inc()
			}
			blamed = true
		}
		b.from[k] = nil
	}
	return blamed, nil
}

// stealable reports whether range t of owner's share, which owner is still reading from the
// source, is read from the source by this node, which has read its own share (end-game work
// stealing, peer.Swarm.Stealable). The owner, seeing this node read it, puts it off and takes it
// from this node (putOff), so the last ranges of a slow share are read by more nodes at once
// rather than one after another by their owner while the others wait.
func (j *Job) stealable(t task, owner string) bool {
	b := t.big
	return j.peers.sw().Stealable(owner, j.peers.rank(t.i), int64(t.idx), int64(len(b.from)), b.chunk, t.obj.Size)
}

// waitsForOwner reports whether range t, put off, is left to a peer that reads it from the
// source now, or to its owner, which is still reading its share and comes to it before this node
// could take it (stealable).
func (j *Job) waitsForOwner(t task) bool {
	if t.big == nil || !t.big.eligible || j.peers.sw() == nil || j.peers.holds(t) {
		return false
	}
	if j.peers.busy(t) {
		return true
	}
	o := j.peers.owner(t)
	return o != j.peers.self && j.peers.sw().Fetching(o) && !j.stealable(t, o)
}

// stealsNow reports whether range t, put off, is read from the source by this node now, in its
// owner's place (stealable): every range of this node's own share of the entry has been read or
// is being read (steals wait until a node's own share no longer needs its streams).
func (j *Job) stealsNow(t task) bool {
	if t.big == nil || !t.big.eligible || j.peers.sw() == nil || j.peers.busy(t) {
		return false
	}
	o := j.peers.owner(t)
	return o != j.peers.self && j.peers.sw().Fetching(o) && j.ownShareRead(t) && j.stealable(t, o)
}

// ownShareRead reports whether every range of this node's share of t's entry is held or being
// read, here or by a peer.
func (j *Job) ownShareRead(t task) bool {
	sw, b := j.peers.sw(), t.big
	from, to := sw.ShareOf(j.peers.self, int64(len(b.from)))
	rank := j.peers.rank(t.i)
	for p := from; p < to; p++ {
		off := p * b.chunk
		n := min(b.chunk, t.obj.Size-off)
		if !j.peers.holding.HasRange(rank, off, n) && !j.peers.holding.IsBusy(rank, off, n) &&
			!sw.Holds(rank, off, n) && !sw.Busy(rank, off, n) {
			return false
		}
	}
	return true
}
