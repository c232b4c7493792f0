package peer

// The serving side's store (docs/datasets.md, "Peer fan-out"): what this node holds of a dataset
// version — a ready one in a pool's cache, or a staging under way — named as peers name entries
// (names.go), and the bytes of those entries. fetch.go is the side that reads from peers.

import (
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sync"

	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"github.com/cistern-csi/cistern/pkg/datasource/dataset"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// Holding is what a staging holds and serves of its version while it fetches.
type Holding struct {
	mu      sync.Mutex
	entries []byte  // committed (verified) entries
	ranges  []Range // ranges of unfinished large entries read from the source itself
	busy    []Range // pieces being read from the source now
}

// Commit records that entry i is verified and committed: it is held whole.
func (h *Holding) Commit(i int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.entries = SetEntry(h.entries, i)
	h.ranges = slices.DeleteFunc(h.ranges, func(r Range) bool { return r.Index == i })
}

// AddRange records a range of a large entry read from the source itself.
func (h *Holding) AddRange(r Range) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ranges = append(h.ranges, r)
}

// SetBusy records that a piece is being read from the source now, or no more.
func (h *Holding) SetBusy(r Range, busy bool) {
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

// IsBusy reports whether [off, off+n) of entry i is being read from the source now.
func (h *Holding) IsBusy(i, off, n int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return (&Have{Busy: h.busy}).IsBusy(i, off, n)
}

// Have is what the staging holds now, as a peer is told.
func (h *Holding) Have() *Have {
	h.mu.Lock()
	defer h.mu.Unlock()
	return &Have{Entries: slices.Clone(h.entries), Ranges: slices.Clone(h.ranges), Busy: slices.Clone(h.busy)}
}

// HasEntry reports whether entry i is held whole.
func (h *Holding) HasEntry(i int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return (&Have{Entries: h.entries}).HasEntry(i)
}

// HasRange reports whether [off, off+n) of entry i is held.
func (h *Holding) HasRange(i, off, n int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return (&Have{Ranges: h.ranges}).Has(i, off, n)
}

// CacheStore is the Store of a node's dataset cache: the ready versions in its pools' caches,
// and the stagings under way, which the coordinator finds.
type CacheStore struct {
	// Staging returns the staging under way of version (id, digest) whose entries are named for
	// peers; nil when there is none.
	Staging func(id, digest string) *Staging
	// Stagings lists the digests of the versions of dataset id staging under way whose entries
	// are named for peers.
	Stagings func(id string) []string
	// Pools lists the pool directories whose caches may hold a ready version.
	Pools func() []string

	mu    sync.Mutex
	names map[string]*Names // manifest path and digest -> names
	ready map[string]string // id/digest -> directory of the ready version
}

// Staging is a staging under way as the server sees it: its dataset directory, what it holds, and
// the names of its manifest's entries.
type Staging struct {
	Dir     string
	Holding *Holding
	Names   *Names
}

// cachedNames bounds the ready versions whose names and directories are remembered.
const cachedNames = 8

func (s *CacheStore) readyNames(dir, digest string) (*Names, error) {
	key := dir + "\x00" + digest
	s.mu.Lock()
	c, ok := s.names[key]
	s.mu.Unlock()
	if ok {
		return c, nil
	}
	c, err := BuildNames(filepath.Join(dir, cache.ObjectsFile))
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.names == nil || len(s.names) >= cachedNames {
		s.names = map[string]*Names{}
	}
	s.names[key] = c
	return c, nil
}

// Versions implements Store: the digests of the S3 versions of dataset id staging or ready on
// this node's pools, for the peer port to resolve a request's bound version name.
func (s *CacheStore) Versions(id string) []string {
	out := s.Stagings(id)
	s.eachReadyS3(id, func(_, d string) bool {
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
		return true
	})
	return out
}

// eachReadyS3 calls f with the directory and manifest digest of each ready S3 version of dataset
// id on this node's pools (current and kept), until f returns false.
func (s *CacheStore) eachReadyS3(id string, f func(dir, digest string) bool) {
	for _, pool := range s.Pools() {
		for _, v := range cache.ReadyVersions(pool, id) {
			if v.Meta.Spec == nil || v.Meta.Spec.Scheme != dataset.SchemeS3 {
				continue
			}
			if !f(v.Dir, v.Digest) {
				return
			}
		}
	}
}

// Have implements Store: a ready S3 dataset of this version on any pool, or a staging of it
// under way. Only S3 datasets are served: NFS and node-local ones have no checksums a fetcher
// could check, and a node-local directory is the node's own.
func (s *CacheStore) Have(id, digest string) (*Have, bool) {
	if st := s.Staging(id, digest); st != nil {
		return st.Holding.Have(), true
	}
	if _, ok := s.readyVersion(id, digest); ok {
		return &Have{Ready: true}, true
	}
	return nil, false
}

func (s *CacheStore) readyVersion(id, digest string) (string, bool) {
	key := id + "/" + digest
	s.mu.Lock()
	dir, ok := s.ready[key]
	s.mu.Unlock()
	// A version found once stays where it is until it is retired or evicted (tree/ goes).
	if ok && cache.IsReady(dir) {
		return dir, true
	}
	found := ""
	s.eachReadyS3(id, func(d, dg string) bool {
		if dg != digest {
			return true
		}
		found = d
		return false
	})
	if found == "" {
		return "", false
	}
	s.mu.Lock()
	if s.ready == nil || len(s.ready) >= cachedNames {
		s.ready = map[string]string{}
	}
	s.ready[key] = found
	s.mu.Unlock()
	return found, true
}

// Open implements Store; r is the entry's rank (Names).
func (s *CacheStore) Open(id, digest string, r, off, n int64) (io.ReadCloser, error) {
	if st := s.Staging(id, digest); st != nil {
		if rc, ok, err := st.open(r, off, n); ok {
			return rc, err
		}
	}
	dir, ok := s.readyVersion(id, digest)
	if !ok {
		return nil, ErrNotHeld
	}
	c, err := s.readyNames(dir, digest)
	if err != nil {
		return nil, err
	}
	o, err := c.Entry(filepath.Join(dir, cache.ObjectsFile), r)
	if err != nil {
		return nil, err
	}
	return openPiece(dir, []string{path.Join(cache.TreeDir, o.Key)}, o, off, n)
}

// open opens [off, off+n) of the entry of rank r when the staging holds it (ok); an entry the
// manifest does not have as a file is an error, as is one that cannot be read.
func (st *Staging) open(r, off, n int64) (rc io.ReadCloser, ok bool, err error) {
	manifest := filepath.Join(st.Dir, cache.ObjectsFile)
	var names []string
	switch {
	case st.Holding.HasEntry(r):
		o, err := st.Names.Entry(manifest, r)
		if err != nil {
			return nil, true, err
		}
		// Committed into staging/, or already published as tree/.
		names = []string{path.Join(cache.StagingDir, o.Key), path.Join(cache.TreeDir, o.Key)}
		rc, err := openPiece(st.Dir, names, o, off, n)
		return rc, err == nil, nil
	case st.Holding.HasRange(r, off, n):
		o, err := st.Names.Entry(manifest, r)
		if err != nil {
			return nil, true, err
		}
		// Gone from tmp/ when the entry was just verified and committed: then it is in the
		// ready tree below, or no more.
		names = []string{cache.TmpName(st.Names.Line(r)), path.Join(cache.StagingDir, o.Key), path.Join(cache.TreeDir, o.Key)}
		rc, err := openPiece(st.Dir, names, o, off, n)
		return rc, err == nil, nil
	}
	return nil, false, nil
}

// openPiece opens the first of names (inside dir, never through a link out of it) that is o's
// file, and returns [off, off+n) of it.
func openPiece(dir string, names []string, o source.Object, off, n int64) (io.ReadCloser, error) {
	if off+n > o.Size {
		return nil, ErrNotHeld
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, ErrNotHeld
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
		if m, ok := mapPiece(f, off, n); ok {
			return m, nil
		}
		return struct {
			io.Reader
			io.Closer
		}{io.NewSectionReader(f, off, n), f}, nil
	}
	return nil, ErrNotHeld
}
