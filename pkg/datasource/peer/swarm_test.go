package peer

import (
	"context"
	"testing"
	"time"
)

type fixedPeers []Peer

func (f fixedPeers) Peers(string) []Peer { return f }

func swarmOf(t *testing.T, self string, peers ...Peer) *Swarm {
	t.Helper()
	n, err := NewNetwork(NetworkConfig{Self: self, Directory: fixedPeers(peers), Token: func() (string, error) { return "", nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := n.Swarm(ctx, testID, testDigest)
	t.Cleanup(func() { cancel(); s.Close() })
	return s
}

// TestShares: nodes staging together own equal shares of the pieces, agree on who owns which,
// and each starts inside its own share.
func TestShares(t *testing.T) {
	names := []string{"c", "a", "d", "b"}
	var all []Peer
	for _, n := range names {
		all = append(all, Peer{Node: n, Address: n + ":1", CertHash: "h"})
	}
	const pieces = 1000
	owned := map[string]int{}
	for _, self := range names {
		s := swarmOf(t, self, all...)
		start := s.Offset(pieces, "entries")
		if got := s.Owner(start, pieces); got != self {
			t.Errorf("%s starts at %d, in %s's share", self, start, got)
		}
		// Every node knows which pieces are the others' shares.
		for _, other := range names {
			from, to := s.ShareOf(other, pieces)
			if to-from != pieces/int64(len(names)) || s.Owner(from, pieces) != other || s.Owner(to-1, pieces) != other {
				t.Errorf("%s: %s's share is [%d, %d)", self, other, from, to)
			}
		}
		for pos := range int64(pieces) {
			if self == "a" {
				owned[s.Owner(pos, pieces)]++
			}
		}
		// Every node computes the same owners.
		for _, pos := range []int64{0, 249, 250, 999} {
			if got, want := s.Owner(pos, pieces), []string{"a", "a", "b", "d"}[map[int64]int{0: 0, 249: 1, 250: 2, 999: 3}[pos]]; got != want {
				t.Errorf("%s: owner of %d is %s, want %s", self, pos, got, want)
			}
		}
	}
	for _, n := range names {
		if owned[n] != pieces/len(names) {
			t.Errorf("%s owns %d pieces, want %d", n, owned[n], pieces/len(names))
		}
	}
}

// TestChoose: a piece comes from a peer that holds it, waits for one reading it, and otherwise
// comes from the source; a peer that served a wrong byte is not asked again.
func TestChoose(t *testing.T) {
	n, err := NewNetwork(NetworkConfig{Self: "a", Directory: fixedPeers(nil), Token: func() (string, error) { return "", nil }})
	if err != nil {
		t.Fatal(err)
	}
	// What two polls of b and c would have found (no poll runs: the swarm is not started).
	s := &Swarm{net: n, id: testID, digest: testDigest, members: []string{"a", "b", "c"}, peers: map[string]*peerState{
		"b:1": {Peer: Peer{Node: "b", Address: "b:1"}, have: &Have{Entries: SetEntry(nil, 1), Busy: []Range{{Index: 2, N: 10}}}},
		"c:1": {Peer: Peer{Node: "c", Address: "c:1"}, have: &Have{Ready: true}},
	}}
	if p, c := s.Pick(1, 0, 10); c != FromPeer || (p.Node != "b" && p.Node != "c") {
		t.Fatalf("entry 1: %v %v", p, c)
	}
	s.Wrong(Peer{Node: "c", Address: "c:1"})
	s.Done(Peer{Node: "b", Address: "b:1"}, false)
	if p, c := s.Pick(3, 0, 10); c != FromSource {
		t.Fatalf("entry 3 after c was dropped: %v %v", p, c)
	}
	if _, c := s.Pick(2, 0, 10); c != Wait || !s.Busy(2, 0, 10) {
		t.Fatalf("entry 2, which b is reading: %v", c)
	}
	if !s.Fetching("b") || !s.Staging("b") || s.Staging("c") {
		t.Fatal("b is staging and fetching; c is dropped")
	}
}

// TestPickBatch: a batch goes to the peer that serves batches and holds the most of it; a peer
// of an earlier version (no batches) and a dropped peer are never asked for one.
func TestPickBatch(t *testing.T) {
	n, err := NewNetwork(NetworkConfig{Self: "a", Directory: fixedPeers(nil), PollInterval: time.Hour,
		Token: func() (string, error) { return "", nil }})
	if err != nil {
		t.Fatal(err)
	}
	var bBits, cBits []byte
	for i := range int64(10) {
		bBits = SetEntry(bBits, i)
		if i%2 == 0 {
			cBits = SetEntry(cBits, i)
		}
	}
	s := &Swarm{net: n, id: testID, digest: testDigest, members: []string{"a", "b", "c", "d"}, peers: map[string]*peerState{
		"b:1": {Peer: Peer{Node: "b", Address: "b:1"}, have: &Have{Entries: bBits, Batch: 3}},
		"c:1": {Peer: Peer{Node: "c", Address: "c:1"}, have: &Have{Entries: cBits, Batch: MaxBatchPieces}},
		"d:1": {Peer: Peer{Node: "d", Address: "d:1"}, have: &Have{Ready: true}}, // no batches
	}}
	pieces := []Range{{Index: 0, N: 1}, {Index: 1, N: 1}, {Index: 2, N: 1}, {Index: 4, N: 1}, {Index: 11, N: 1}}
	// b holds four but sends three at most; c holds three, and is as good: either is picked.
	p, held, c := s.PickBatch(pieces)
	if c != FromPeer || p.Node != "b" && p.Node != "c" {
		t.Fatalf("got %v %v", p, c)
	}
	count := 0
	for k, h := range held {
		if h {
			count++
			if !s.peers[p.Address].have.Has(pieces[k].Index, 0, 1) {
				t.Errorf("piece %d marked held by %s, which does not hold it", k, p.Node)
			}
		}
	}
	if count != 3 {
		t.Errorf("%d pieces asked of %s, want 3", count, p.Node)
	}
	if !s.HoldsBatch(1, 0, 1) || s.HoldsBatch(11, 0, 1) {
		t.Error("HoldsBatch: entry 1 is held by b; entry 11 only by d, which serves no batches")
	}
	s.Wrong(Peer{Node: "b", Address: "b:1"})
	if p, held, c := s.PickBatch(pieces); c != FromPeer || p.Node != "c" || held[1] || !held[0] {
		t.Fatalf("after b was dropped: %v %v %v", p, held, c)
	}
	s.Refused(Peer{Node: "c", Address: "c:1"})
	if _, _, c := s.PickBatch(pieces); c != Wait {
		t.Fatalf("c refused a moment ago: %v, want Wait", c)
	}
	if _, _, c := s.PickBatch([]Range{{Index: 11, N: 1}}); c != FromSource {
		t.Fatalf("only d, without batches, holds entry 11: %v", c)
	}
}

// TestStealable: a node done with its share reads from the source a range of another member's
// share that no one holds or reads and that the member comes to after another it has not read;
// never the range the member reads next, one it reads now, or one a peer holds.
func TestStealable(t *testing.T) {
	n, err := NewNetwork(NetworkConfig{Self: "a", Directory: fixedPeers(nil), Token: func() (string, error) { return "", nil }})
	if err != nil {
		t.Fatal(err)
	}
	// Entry 7: 8 ranges of 10 bytes, the last 5; b's share is ranges 4-7. b holds range 4 and
	// reads range 5; c holds range 7.
	const chunk, size, pieces = 10, 75, 8
	s := &Swarm{net: n, id: testID, digest: testDigest, members: []string{"a", "b"}, peers: map[string]*peerState{
		"b:1": {Peer: Peer{Node: "b", Address: "b:1"}, have: &Have{Ranges: []Range{{Index: 7, Off: 40, N: 10}}, Busy: []Range{{Index: 7, Off: 50, N: 10}}}},
		"c:1": {Peer: Peer{Node: "c", Address: "c:1"}, have: &Have{Ranges: []Range{{Index: 7, Off: 70, N: 5}}}},
	}}
	for _, tc := range []struct {
		name  string
		owner string
		k     int64
		want  bool
	}{
		{"the range b reads next", "b", 6, false},
		{"b holds it", "b", 4, false},
		{"b reads it now", "b", 5, false},
		{"c holds it", "b", 7, false},
		{"not b's share", "b", 3, false},
		{"a is not reading its share", "a", 2, false},
	} {
		if got := s.Stealable(tc.owner, 7, tc.k, pieces, chunk, size); got != tc.want {
			t.Errorf("%s: range %d of %s's share: stealable %v, want %v", tc.name, tc.k, tc.owner, got, tc.want)
		}
	}
	// b reads range 4 now and holds none: ranges 6 and 7 come after 5, which b reads first.
	s.peers["b:1"].have = &Have{Busy: []Range{{Index: 7, Off: 40, N: 10}}}
	delete(s.peers, "c:1")
	for k, want := range map[int64]bool{4: false, 5: false, 6: true, 7: true} {
		if got := s.Stealable("b", 7, k, pieces, chunk, size); got != want {
			t.Errorf("b reading range 4: range %d stealable %v, want %v", k, got, want)
		}
	}
}
