package stage

// A job's sharing with its peers: the swarm it fetches from, what it holds and serves meanwhile,
// how it names entries as peers do, and the pieces it puts off while a peer reads them.

import (
	"sync"
	"sync/atomic"

	"github.com/cistern-csi/cistern/pkg/datasource/peer"
)

// sharing is a job's state among its peers; the zero value (no peers) shares nothing.
type sharing struct {
	// self is this node's name among its peers.
	self string
	// entries is the number of the manifest's entries, which are shared out by rank.
	entries int64
	// swarm, when the node has peers, fetches pieces from the nodes that hold them (peers.go);
	// holding is what this job serves them meanwhile.
	swarm   *peer.Swarm
	holding peer.Holding
	// names names the manifest's entries as peers do (peer.Names); set before swarm.
	names atomic.Pointer[peer.Names]
	// deferred are small entries put off while a peer read them (runTask), deferredRanges ranges
	// of large entries.
	deferMu        sync.Mutex
	deferred       []task
	deferredRanges []task
}

// rank is the name peers give manifest line i.
func (s *sharing) rank(i int64) int64 { return s.names.Load().Rank(i) }

// holds reports whether a peer holds task t's piece now (and may serve it).
func (s *sharing) holds(t task) bool {
	if s.swarm == nil {
		return false
	}
	if t.big != nil {
		return t.big.eligible && s.swarm.Holds(s.rank(t.i), t.off, t.n)
	}
	return md5ETag.MatchString(t.obj.ETag) && s.swarm.Holds(s.rank(t.i), 0, t.obj.Size)
}

// busy reports whether a peer is reading task t's piece from the source now, and holds it
// nowhere yet.
func (s *sharing) busy(t task) bool {
	if s.swarm == nil {
		return false
	}
	off, n, eligible := int64(0), t.obj.Size, md5ETag.MatchString(t.obj.ETag)
	if t.big != nil {
		off, n, eligible = t.off, t.n, t.big.eligible
	}
	return eligible && s.swarm.Busy(s.rank(t.i), off, n)
}

// owner is the node whose share task t's piece is: entries are shared out by rank, the ranges
// of a large entry by their index.
func (s *sharing) owner(t task) string {
	if s.swarm == nil {
		return ""
	}
	if t.big != nil {
		return s.swarm.Owner(int64(t.idx), int64(len(t.big.from)))
	}
	return s.swarm.Owner(s.rank(t.i), s.entries)
}

// othersShare reports whether task t's piece is another node's share that no peer holds yet.
func (s *sharing) othersShare(t task) bool {
	if s.swarm == nil {
		return false
	}
	o := s.owner(t)
	return o != s.self && !s.holds(t) && s.swarm.Staging(o)
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

// readOrder is where this node starts in a list of n pieces (peer.Swarm.Offset); without peers,
// at the start.
func (s *sharing) readOrder(n int64, salt string) int64 {
	if s.swarm == nil {
		return 0
	}
	return s.swarm.Offset(n, salt)
}

// batchEligible reports whether task t is a whole entry small enough for a batch that a peer's
// bytes can be checked for (its MD5 ETag).
func (s *sharing) batchEligible(t task) bool {
	return s.swarm != nil && t.big == nil && t.obj.Size > 0 && t.obj.Size <= batchEntry && md5ETag.MatchString(t.obj.ETag)
}

// batchable reports whether task t goes into a batch: eligible, and a peer that serves batches
// holds it now.
func (s *sharing) batchable(t task) bool {
	return s.batchEligible(t) && s.swarm.HoldsBatch(s.rank(t.i), 0, t.obj.Size)
}

// awaited reports whether a peer is reading task t's piece from the source now, or it is the
// share of a node still reading its share: it will have it soon.
func (s *sharing) awaited(t task) bool {
	if s.busy(t) {
		return true
	}
	o := s.owner(t)
	return o != s.self && s.swarm.Fetching(o)
}
