package datasource

// Peer fan-out, the serving side (package peer, docs/datasets.md): what this node holds of a
// dataset version — a ready one, or a staging under way — named as peers name entries, and the
// bytes of those entries. peerfetch.go is the side that reads from peers.

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
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

// Versions implements peer.Store: the digests of the S3 versions of dataset id staging or ready
// on this node's pools, for the peer port to resolve a request's bound version name.
func (m *Manager) Versions(id string) []string {
	var out []string
	m.mu.Lock()
	for _, j := range m.jobs {
		if md := j.md.Load(); j.id == id && j.req.Spec.Scheme == SchemeS3 && j.canon.Load() != nil && md != nil {
			out = append(out, md.Digest)
		}
	}
	m.mu.Unlock()
	for _, pool := range m.poolList() {
		dir := datasetDir(pool, id)
		if !isReady(dir) {
			continue
		}
		md, err := readMeta(dir)
		if err != nil || md.Spec == nil || md.Spec.Scheme != SchemeS3 {
			continue
		}
		if d, err := manifestDigest(dir, md); err == nil && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
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
			// Gone from tmp/ when the entry was just verified and committed: then it is in the
			// ready tree below, or no more.
			if rc, err := openPiece(j.dir, []string{path.Join(tmpDir, tmpShard(l), tmpBase(l)), path.Join(stagingDir, o.Key), path.Join(treeDir, o.Key)}, o, off, n); err == nil {
				return rc, nil
			}
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
