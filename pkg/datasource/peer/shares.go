package peer

// How the members of a swarm share the pieces of a version out: each owns an equal share by name
// and reads it from the source, starting at a place of its own; a member done with its share may
// read the last ranges of a slower one in its place (Stealable).

import (
	"hash/fnv"
	"slices"
)

// Offset is where this node starts among n pieces (of a version, or of one large entry named by
// salt): the nodes staging together share the pieces out evenly by name (Owner), and each starts
// at a place of its own hash inside its share.
func (s *Swarm) Offset(n int64, salt string) int64 {
	if n <= 1 {
		return 0
	}
	self := s.net.cfg.Self
	rank, count := int64(slices.Index(s.members, self)), int64(len(s.members))
	h := fnv.New64a()
	h.Write([]byte(self + "\x00" + salt))
	share := max(n/count, 1)
	return (rank*n/count + int64(h.Sum64()%uint64(share))) % n
}

// ShareOf is the pieces [from, to) of n that are member node's share (Owner).
func (s *Swarm) ShareOf(node string, n int64) (from, to int64) {
	rank, count := int64(slices.Index(s.members, node)), int64(len(s.members))
	if rank < 0 {
		return 0, 0
	}
	return rank * n / count, (rank + 1) * n / count
}

// Members is the number of nodes sharing the pieces out, this one included.
func (s *Swarm) Members() int { return len(s.members) }

// Owner is the node whose share piece pos of n is: it reads the piece from the source, the others
// from it.
func (s *Swarm) Owner(pos, n int64) string {
	if n <= 0 || pos < 0 || pos >= n {
		return s.net.cfg.Self
	}
	return s.members[pos*int64(len(s.members))/n]
}

// ReadingAt is what member node is reading of entry i from the source now, as its last answer
// said.
func (s *Swarm) ReadingAt(node string, i int64) []Range {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Range
	for _, ps := range s.peers {
		if ps.Node != node || ps.have == nil {
			continue
		}
		for _, r := range ps.have.Busy {
			if r.Index == i {
				out = append(out, r)
			}
		}
	}
	return out
}

// Stealable reports whether range k of entry i (ranges of chunk bytes, pieces of them in an
// entry of size bytes) is owner's share and better read from the source by this node than left
// to owner: no peer holds it or reads it, and owner, which reads its share in order, reads
// another range it holds nowhere yet before it. (A node that would take the very range its owner
// comes to next would read it twice from the source.) False when owner's place is not known.
func (s *Swarm) Stealable(owner string, i, k, pieces, chunk, size int64) bool {
	from, to := s.ShareOf(owner, pieces)
	if k < from || k >= to || chunk <= 0 {
		return false
	}
	// Where the owner is in its share: the furthest range it reads now.
	q := int64(-1)
	for _, r := range s.ReadingAt(owner, i) {
		if p := r.Off / chunk; p >= from && p < to && p > q {
			q = p
		}
	}
	if q < 0 || q == k {
		return false
	}
	if off := k * chunk; s.Holds(i, off, min(chunk, size-off)) || s.Busy(i, off, min(chunk, size-off)) {
		return false
	}
	n := to - from
	for p := from + (q-from+1)%n; p != k; p = from + (p-from+1)%n {
		off := p * chunk
		if !s.Holds(i, off, min(chunk, size-off)) && !s.Busy(i, off, min(chunk, size-off)) {
			return true
		}
	}
	return false
}
