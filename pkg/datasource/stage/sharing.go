package stage

// A job's sharing with its peers: the swarm it fetches from, what it holds and serves meanwhile,
// how it names entries as peers do, and the pieces it puts off while a peer reads them.

import (
	"hash/fnv"
	"sync"
	"sync/atomic"

	"github.com/cistern-csi/cistern/pkg/datasource/etag"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
)

// sharing is a job's state among its peers; the zero value (no peers) shares nothing.
type sharing struct {
	// self is this node's name among its peers.
	self string
	// entries is the number of the manifest's entries, which are shared out by rank.
	entries int64
	// swarm, once the node has peers, fetches pieces from the nodes that hold them (peers.go);
	// it may be set while the job fetches (watchPeers), never unset. holding is what this job
	// serves peers meanwhile, from before it knows any.
	swarm   atomic.Pointer[peer.Swarm]
	holding peer.Holding
	// joined is closed once swarm is set; nil when the job shares nothing (no peer network, or
	// not an S3 source).
	joined chan struct{}
	// fetched is set once the job fetched every piece: it joins no swarm after.
	fetched atomic.Bool
	// names names the manifest's entries as peers do (peer.Names); set before swarm.
	names atomic.Pointer[peer.Names]
	// deferred are small entries put off while a peer read them (runTask), deferredRanges ranges
	// of large entries.
	deferMu        sync.Mutex
	deferred       []task
	deferredRanges []task
}

// sw is the job's swarm: nil until the node knows a peer of the dataset.
func (s *sharing) sw() *peer.Swarm { return s.swarm.Load() }

// mayShare reports whether the job may fetch from peers at all (a peer network and an S3
// source), now or once it learns of them.
func (s *sharing) mayShare() bool { return s.joined != nil }

// shared reports whether the job serves peers what it holds (its entries are named).
func (s *sharing) shared() bool { return s.names.Load() != nil }

// rank is the name peers give manifest line i.
func (s *sharing) rank(i int64) int64 { return s.names.Load().Rank(i) }

// holds reports whether a peer holds task t's piece now (and may serve it).
func (s *sharing) holds(t task) bool {
	if s.sw() == nil {
		return false
	}
	if t.big != nil {
		return t.big.eligible && s.sw().Holds(s.rank(t.i), t.off, t.n)
	}
	return checkableWhole(t.obj) && s.sw().Holds(s.rank(t.i), 0, t.obj.Size)
}

// busy reports whether a peer is reading task t's piece from the source now, and holds it
// nowhere yet.
func (s *sharing) busy(t task) bool {
	if s.sw() == nil {
		return false
	}
	off, n, eligible := int64(0), t.obj.Size, checkableWhole(t.obj)
	if t.big != nil {
		off, n, eligible = t.off, t.n, t.big.eligible
	}
	return eligible && s.sw().Busy(s.rank(t.i), off, n)
}

// owner is the node whose share task t's piece is: entries are shared out by rank, the ranges
// of a large entry by their index.
func (s *sharing) owner(t task) string {
	if s.sw() == nil {
		return ""
	}
	if t.big != nil {
		return s.sw().Owner(int64(t.idx), int64(len(t.big.from)))
	}
	return s.sw().Owner(s.rank(t.i), s.entries)
}

// othersShare reports whether task t's piece is another node's share that no peer holds yet.
func (s *sharing) othersShare(t task) bool {
	if s.sw() == nil {
		return false
	}
	o := s.owner(t)
	return o != s.self && !s.holds(t) && s.sw().Staging(o)
}

func (s *sharing) deferTask(t task) {
	s.deferMu.Lock()
	defer s.deferMu.Unlock()
	if t.big != nil {
		s.deferredRanges = append(s.deferredRanges, t)
	} else {
		s.deferred = append(s.deferred, t)
	}
}

func (s *sharing) takeDeferred() []task {
	s.deferMu.Lock()
	defer s.deferMu.Unlock()
	d := append(s.deferredRanges, s.deferred...)
	s.deferred, s.deferredRanges = nil, nil
	return d
}

// readOrder is where this node starts in a list of n pieces (peer.Swarm.Offset). A node that
// shares but knows no peer yet starts at a place of its own name's hash: nodes that start
// together and learn of each other a moment later have read different pieces meanwhile, which
// they then take from each other. Without sharing, at the start.
func (s *sharing) readOrder(n int64, salt string) int64 {
	switch {
	case s.sw() != nil:
		return s.sw().Offset(n, salt)
	case !s.shared() || n <= 1:
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(s.self + "\x00" + salt))
	return int64(h.Sum64() % uint64(n))
}

// batchEligible reports whether task t is a whole entry small enough for a batch that a peer's
// bytes can be checked for (its MD5 ETag).
func (s *sharing) batchEligible(t task) bool {
	return s.sw() != nil && t.big == nil && t.obj.Size > 0 && t.obj.Size <= batchEntry && etag.IsMD5(t.obj.ETag)
}

// batchable reports whether task t goes into a batch: eligible, and a peer that serves batches
// holds it now.
func (s *sharing) batchable(t task) bool {
	return s.batchEligible(t) && s.sw().HoldsBatch(s.rank(t.i), 0, t.obj.Size)
}

// awaited reports whether a peer is reading task t's piece from the source now, or it is the
// share of a node still reading its share: it will have it soon.
func (s *sharing) awaited(t task) bool {
	if s.busy(t) {
		return true
	}
	o := s.owner(t)
	return o != s.self && s.sw().Fetching(o)
}
