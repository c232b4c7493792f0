package peer

import (
	"context"
	"testing"
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
