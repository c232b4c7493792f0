package datasource

// Peer fan-out (package peer, docs/datasets.md): this node serves what it holds of a dataset
// version to other node plugins, and a staging job reads pieces from peers before the source.
//
// What a fetcher takes from a peer it checks against what the source said, with the caller's own
// credentials: a whole entry against its MD5 ETag from the listing; a large entry, read in
// ranges, against the S3 full-object CRC (HEAD), its multipart ETag (parts aligned with the
// part size HEAD gave) or its MD5 ETag, over the whole entry before it leaves tmp/. S3 has no
// usable checksum per range of an object uploaded without part checksums, so a range is not
// checked alone: when a large entry fails, every range a peer served is read again from the
// source, and each peer whose bytes differ is dropped. An entry with none of these checksums
// (an SSE-KMS ETag, a SHA-256 full-object checksum only) is read from the source alone.

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"io"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"sync"

	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// holding is what a staging job holds and serves of its version while it fetches.
type holding struct {
	mu      sync.Mutex
	entries []byte       // committed (verified) entries
	ranges  []peer.Range // ranges of unfinished large entries read from the source itself
	busy    []peer.Range // pieces being read from the source now
}

func (h *holding) commit(i int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.entries = peer.SetEntry(h.entries, i)
	h.ranges = slices.DeleteFunc(h.ranges, func(r peer.Range) bool { return r.Index == i })
}

func (h *holding) addRange(r peer.Range) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ranges = append(h.ranges, r)
}

func (h *holding) setBusy(r peer.Range, busy bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if busy {
		h.busy = append(h.busy, r)
		return
	}
	if k := slices.Index(h.busy, r); k >= 0 {
		h.busy = slices.Delete(h.busy, k, k+1)
	}
}

func (h *holding) have() *peer.Have {
	h.mu.Lock()
	defer h.mu.Unlock()
	return &peer.Have{Entries: slices.Clone(h.entries), Ranges: slices.Clone(h.ranges), Busy: slices.Clone(h.busy)}
}

func (h *holding) hasEntry(i int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return (&peer.Have{Entries: h.entries}).HasEntry(i)
}

func (h *holding) hasRange(i, off, n int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return (&peer.Have{Ranges: h.ranges}).Has(i, off, n)
}

// canon names a manifest's entries the same way on every node. Listings come in any order
// (prefixes are listed in parallel), so a manifest's line numbers differ between nodes; peers
// name an entry by its rank among the entries sorted by a hash of their keys, which equal
// manifests (equal digests) share. It costs 16 bytes per entry, only while peers are used.
type canon struct {
	rank []uint32 // manifest line -> rank
	line []uint32 // rank -> manifest line
	offs []int64  // where each line starts, and the manifest's end
}

// buildCanon reads the manifest in dir once. Two keys with the same 64-bit hash (only a key
// crafted for it) leave the dataset without peers: an error.
func buildCanon(dir string) (*canon, error) {
	f, err := os.Open(filepath.Join(dir, objectsFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c := &canon{offs: []int64{0}}
	var hashes []uint64
	r := bufio.NewReaderSize(f, 256<<10)
	var pos int64
	var line []byte
	for {
		part, err := r.ReadSlice('\n')
		pos += int64(len(part))
		line = append(line, part...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if len(line) > 0 && line[len(line)-1] == '\n' {
			var o struct {
				Key string `json:"k"`
			}
			if err := json.Unmarshal(line, &o); err != nil {
				return nil, fmt.Errorf("corrupt manifest line %d: %w", len(c.offs), err)
			}
			h := fnv.New64a()
			h.Write([]byte(o.Key))
			hashes = append(hashes, h.Sum64())
			c.offs = append(c.offs, pos)
			line = line[:0]
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if len(hashes) > math.MaxUint32 {
		return nil, errors.New("too many entries for peers")
	}
	c.line = make([]uint32, len(hashes))
	for k := range c.line {
		c.line[k] = uint32(k)
	}
	slices.SortFunc(c.line, func(a, b uint32) int { return cmp.Compare(hashes[a], hashes[b]) })
	c.rank = make([]uint32, len(hashes))
	for r, l := range c.line {
		if r > 0 && hashes[l] == hashes[c.line[r-1]] {
			return nil, errors.New("two keys of the manifest share a hash; the dataset is not shared with peers")
		}
		c.rank[l] = uint32(r)
	}
	return c, nil
}

// entry reads the manifest entry of rank r.
func (c *canon) entry(dir string, r int64) (source.Object, error) {
	if r < 0 || r >= int64(len(c.line)) {
		return source.Object{}, peer.ErrNotHeld
	}
	l := c.line[r]
	f, err := os.Open(filepath.Join(dir, objectsFile))
	if err != nil {
		return source.Object{}, err
	}
	defer f.Close()
	b := make([]byte, c.offs[l+1]-c.offs[l])
	if _, err := f.ReadAt(b, c.offs[l]); err != nil {
		return source.Object{}, err
	}
	var o source.Object
	if err := json.Unmarshal(b, &o); err != nil {
		return source.Object{}, err
	}
	if o.Type != source.File {
		return source.Object{}, peer.ErrNotHeld
	}
	return o, nil
}

// rank is the name peers give manifest line i.
func (j *job) rank(i int64) int64 {
	if c := j.canon.Load(); c != nil && i < int64(len(c.rank)) {
		return int64(c.rank[i])
	}
	return i
}

// canons caches the names of the entries of ready datasets that peers ask for.
type canons struct {
	mu    sync.Mutex
	m     map[string]*canon // manifest path and digest -> names
	ready map[string]string // id/digest -> directory of the ready version
}

const cachedCanons = 8

func (m *Manager) readyCanon(dir, digest string) (*canon, error) {
	key := dir + "\x00" + digest
	m.canons.mu.Lock()
	c, ok := m.canons.m[key]
	m.canons.mu.Unlock()
	if ok {
		return c, nil
	}
	c, err := buildCanon(dir)
	if err != nil {
		return nil, err
	}
	m.canons.mu.Lock()
	defer m.canons.mu.Unlock()
	if m.canons.m == nil || len(m.canons.m) >= cachedCanons {
		m.canons.m = map[string]*canon{}
	}
	m.canons.m[key] = c
	return c, nil
}

// Have implements peer.Store: a ready S3 dataset of this version on any pool, or a staging of it
// under way. Only S3 datasets are served: NFS and node-local ones have no checksums a fetcher
// could check, and a node-local directory is the node's own.
func (m *Manager) Have(id, digest string) (*peer.Have, bool) {
	if j := m.stagingVersion(id, digest); j != nil {
		return j.holding.have(), true
	}
	if _, ok := m.readyVersion(id, digest); ok {
		return &peer.Have{Ready: true}, true
	}
	return nil, false
}

// stagingVersion is the job staging a version whose entries are named for peers.
func (m *Manager) stagingVersion(id, digest string) *job {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, j := range m.jobs {
		if j.id != id || j.req.Spec.Scheme != SchemeS3 || j.canon.Load() == nil {
			continue
		}
		if md := j.md.Load(); md != nil && md.Digest == digest {
			return j
		}
	}
	return nil
}

func (m *Manager) readyVersion(id, digest string) (string, bool) {
	key := id + "/" + digest
	m.canons.mu.Lock()
	dir, ok := m.canons.ready[key]
	m.canons.mu.Unlock()
	// A version found once stays where it is until it is retired or evicted (tree/ goes).
	if ok && isReady(dir) {
		return dir, true
	}
	for _, pool := range m.poolList() {
		dir := datasetDir(pool, id)
		if !isReady(dir) {
			continue
		}
		md, err := readMeta(dir)
		if err != nil || md.Spec == nil || md.Spec.Scheme != SchemeS3 {
			continue
		}
		if d, err := manifestDigest(dir, md); err == nil && d == digest {
			m.canons.mu.Lock()
			if m.canons.ready == nil || len(m.canons.ready) >= cachedCanons {
				m.canons.ready = map[string]string{}
			}
			m.canons.ready[key] = dir
			m.canons.mu.Unlock()
			return dir, true
		}
	}
	return "", false
}

// Open implements peer.Store; r is the entry's rank (canon).
func (m *Manager) Open(id, digest string, r, off, n int64) (io.ReadCloser, error) {
	if j := m.stagingVersion(id, digest); j != nil {
		c := j.canon.Load()
		switch {
		case j.holding.hasEntry(r):
			o, err := c.entry(j.dir, r)
			if err != nil {
				return nil, err
			}
			// Committed into staging/, or already published as tree/.
			rc, err := openPiece(j.dir, []string{path.Join(stagingDir, o.Key), path.Join(treeDir, o.Key)}, o, off, n)
			if err == nil {
				return rc, nil
			}
		case j.holding.hasRange(r, off, n):
			o, err := c.entry(j.dir, r)
			if err != nil {
				return nil, err
			}
			l := int64(c.line[r])
			return openPiece(j.dir, []string{path.Join(tmpDir, tmpShard(l), tmpBase(l))}, o, off, n)
		}
	}
	dir, ok := m.readyVersion(id, digest)
	if !ok {
		return nil, peer.ErrNotHeld
	}
	c, err := m.readyCanon(dir, digest)
	if err != nil {
		return nil, err
	}
	o, err := c.entry(dir, r)
	if err != nil {
		return nil, err
	}
	return openPiece(dir, []string{path.Join(treeDir, o.Key)}, o, off, n)
}

// openPiece opens the first of names (inside dir, never through a link out of it) that is o's
// file, and returns [off, off+n) of it.
func openPiece(dir string, names []string, o source.Object, off, n int64) (io.ReadCloser, error) {
	if off+n > o.Size {
		return nil, peer.ErrNotHeld
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, peer.ErrNotHeld
	}
	defer root.Close()
	for _, name := range names {
		f, err := root.Open(name)
		if err != nil {
			continue
		}
		if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() || fi.Size() != o.Size {
			f.Close()
			continue
		}
		return struct {
			io.Reader
			io.Closer
		}{io.NewSectionReader(f, off, n), f}, nil
	}
	return nil, peer.ErrNotHeld
}

// pieceRead is one read of a piece (an entry, or a range of one) in a job that fetches from
// peers: which entry, whether peers may serve it, and which did.
type pieceRead struct {
	i        int64
	eligible bool
	// owner is the node whose share the piece is (peer.Swarm.Owner).
	owner string
	peers []peer.Peer
	waits int
}

// maxWaits bounds the poll rounds a fetcher waits for a piece that a peer is reading from the
// source before it reads the piece from the source itself.
const maxWaits = 120

// open opens [off, off+n) of o: from a peer that holds it, after waiting for one that is reading
// it, or from the source. via is the peer, nil for the source.
func (j *job) open(ctx context.Context, pr *pieceRead, o source.Object, off, n int64) (rc io.ReadCloser, via *peer.Peer, err error) {
	if j.swarm != nil && pr != nil && pr.eligible {
		for {
			p, choice := j.swarm.Pick(pr.i, off, n)
			if choice == peer.FromPeer {
				rc, err := j.swarm.Open(ctx, p, pr.i, off, n)
				if err == nil {
					pr.peers = append(pr.peers, p)
					return rc, &p, nil
				}
				j.swarm.Done(p, true)
				continue
			}
			// Another node's share, which it is still reading from the source: wait for it.
			if choice == peer.FromSource && pr.owner != j.m.cfg.Peers.Self() && j.swarm.Fetching(pr.owner) {
				choice = peer.Wait
			}
			if choice == peer.Wait && pr.waits < maxWaits {
				pr.waits++
				select {
				case <-j.swarm.Polled():
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

// peerHolds reports whether a peer holds task t's piece now (and may serve it).
func (j *job) peerHolds(t task) bool {
	if j.swarm == nil {
		return false
	}
	if t.big != nil {
		return t.big.eligible && j.swarm.Holds(j.rank(t.i), t.off, t.n)
	}
	return md5ETag.MatchString(t.obj.ETag) && j.swarm.Holds(j.rank(t.i), 0, t.obj.Size)
}

// peerBusy reports whether a peer is reading task t's piece from the source now, and holds it
// nowhere yet.
func (j *job) peerBusy(t task) bool {
	if j.swarm == nil {
		return false
	}
	off, n, eligible := int64(0), t.obj.Size, md5ETag.MatchString(t.obj.ETag)
	if t.big != nil {
		off, n, eligible = t.off, t.n, t.big.eligible
	}
	return eligible && j.swarm.Busy(j.rank(t.i), off, n)
}

// owner is the node whose share task t's piece is: entries are shared out by rank, the ranges
// of a large entry by their index.
func (j *job) owner(t task) string {
	if j.swarm == nil {
		return ""
	}
	if t.big != nil {
		return j.swarm.Owner(int64(t.idx), int64(len(t.big.from)))
	}
	return j.swarm.Owner(j.rank(t.i), j.objsTotal.Load())
}

// othersShare reports whether task t's piece is another node's share that no peer holds yet.
func (j *job) othersShare(t task) bool {
	if j.swarm == nil {
		return false
	}
	o := j.owner(t)
	return o != j.m.cfg.Peers.Self() && !j.peerHolds(t) && j.swarm.Staging(o)
}

// eachShared calls fn for the manifest's entries of ranks [from, to) in rank order.
func (j *job) eachShared(from, to int64, fn func(int64, source.Object) error) error {
	c := j.canon.Load()
	f, err := os.Open(filepath.Join(j.dir, objectsFile))
	if err != nil {
		return err
	}
	defer f.Close()
	for r := max(from, 0); r < min(to, int64(len(c.line))); r++ {
		l := c.line[r]
		b := make([]byte, c.offs[l+1]-c.offs[l])
		if _, err := f.ReadAt(b, c.offs[l]); err != nil {
			return err
		}
		var o source.Object
		if err := json.Unmarshal(b, &o); err != nil {
			return fmt.Errorf("corrupt manifest line %d: %w", l+1, err)
		}
		if err := fn(int64(l), o); err != nil {
			return err
		}
	}
	return nil
}

func (j *job) deferTask(t task) {
	j.deferMu.Lock()
	defer j.deferMu.Unlock()
	j.deferred = append(j.deferred, t)
}

func (j *job) takeDeferred() []task {
	j.deferMu.Lock()
	defer j.deferMu.Unlock()
	d := j.deferred
	j.deferred = nil
	return d
}

// readOrder is where this node starts in a list of n pieces (peer.Swarm.Offset); without peers,
// at the start.
func (j *job) readOrder(n int64, salt string) int64 {
	if j.swarm == nil {
		return 0
	}
	return j.swarm.Offset(n, salt)
}

// blame reads the ranges of a large entry that peers served again from the source, drops each
// peer whose bytes differ, and reports whether any did. The ranges' digests are updated from what
// the source sent.
func (j *job) blame(ctx context.Context, t task) (bool, error) {
	b := t.big
	// A descriptor of its own: the object's may be open for direct I/O, which needs aligned reads.
	f, err := j.root.Open(path.Join(tmpDir, tmpShard(t.i), tmpBase(t.i)))
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
				j.swarm.Wrong(p)
				j.m.metrics.wrongPieces.Inc()
			}
			blamed = true
		}
		b.from[k] = nil
	}
	return blamed, nil
}

// tmpShard is the shard directory of entry i's temporary file (tmpDir).
func tmpShard(i int64) string { return strconv.FormatInt(i%tmpShards, 10) }
