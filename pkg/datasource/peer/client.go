package peer

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// Peer is a node plugin's peer port, as its StoragePools publish it.
type Peer struct {
	Node     string
	Address  string // host:port
	CertHash string
}

// Directory finds the nodes that hold or are staging a dataset (the StoragePool inventory).
type Directory interface {
	Peers(id string) []Peer
}

// NetworkConfig configures the client side of a node.
type NetworkConfig struct {
	// Self is this node's name: it is never its own peer.
	Self      string
	Directory Directory
	// Token returns this node plugin's peer token (TokenFile.Token).
	Token func() (string, error)
	// PollInterval is how often a swarm asks its peers what they hold while it fetches (0: 250ms).
	PollInterval time.Duration
	// BanFor is how long a peer that served a wrong byte is not asked again (0: 10 minutes).
	BanFor time.Duration
	// Timeout bounds a request for what a peer holds (0: 5s). Piece reads are bounded by the
	// staging engine's minimum throughput, as source reads are.
	Timeout time.Duration
}

// Network is the client side of a node: the peers it talks to, each over a connection that
// accepts only the certificate the peer published.
type Network struct {
	cfg NetworkConfig

	mu      sync.Mutex
	clients map[Peer]*http.Client
	banned  map[string]time.Time // address -> until
}

// NewNetwork returns a Network.
func NewNetwork(cfg NetworkConfig) (*Network, error) {
	if cfg.Directory == nil || cfg.Token == nil {
		return nil, errors.New("peer network needs a directory and a token")
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 250 * time.Millisecond
	}
	if cfg.BanFor <= 0 {
		cfg.BanFor = 10 * time.Minute
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	return &Network{cfg: cfg, clients: map[Peer]*http.Client{}, banned: map[string]time.Time{}}, nil
}

func (n *Network) client(p Peer) *http.Client {
	n.mu.Lock()
	defer n.mu.Unlock()
	if c, ok := n.clients[p]; ok {
		return c
	}
	c := &http.Client{
		Transport: &http.Transport{
			TLSClientConfig:     pinned(p.CertHash),
			DialContext:         (&net.Dialer{Timeout: n.cfg.Timeout}).DialContext,
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     time.Minute,
			ForceAttemptHTTP2:   false,
		},
		// A peer answers or it does not: it never sends the node elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	n.clients[p] = c
	return c
}

// Self is this node's name.
func (n *Network) Self() string { return n.cfg.Self }

// HasPeers reports whether the directory lists another node for dataset id: without one, a
// staging reads everything from the source, exactly as a node without peers does.
func (n *Network) HasPeers(id string) bool {
	for _, p := range n.cfg.Directory.Peers(id) {
		if p.Node != n.cfg.Self && p.Address != "" && p.CertHash != "" {
			return true
		}
	}
	return false
}

// ban keeps a peer that served a wrong byte out of every swarm for BanFor.
func (n *Network) ban(addr string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.banned[addr] = time.Now().Add(n.cfg.BanFor)
}

func (n *Network) isBanned(addr string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	until, ok := n.banned[addr]
	if ok && time.Now().After(until) {
		delete(n.banned, addr)
		return false
	}
	return ok
}

func (n *Network) get(ctx context.Context, p Peer, path string) (*http.Response, error) {
	return n.do(ctx, p, http.MethodGet, path, nil)
}

func (n *Network) do(ctx context.Context, p Peer, method, path string, body []byte) (*http.Response, error) {
	token, err := n.cfg.Token()
	if err != nil {
		return nil, fmt.Errorf("reading the peer token: %w", err)
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "https://"+p.Address+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := n.client(p).Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, &statusError{code: resp.StatusCode}
	}
	return resp, nil
}

type statusError struct{ code int }

func (e *statusError) Error() string { return fmt.Sprintf("peer answered %d", e.code) }

// HaveOf asks p what it holds of a dataset version.
func (n *Network) HaveOf(ctx context.Context, p Peer, id, digest string) (*Have, error) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.Timeout)
	defer cancel()
	resp, err := n.get(ctx, p, havePath(id, BindVersion(digest, n.cfg.Self, p.Node)))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	h := &Have{}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(h); err != nil {
		return nil, err
	}
	return h, nil
}

// OpenPiece reads [off, off+n) of entry i of a dataset version from p. The bytes are not
// verified: the caller checks them against the source's checksums before anything sees them.
func (n *Network) OpenPiece(ctx context.Context, p Peer, id, digest string, i, off, size int64) (io.ReadCloser, error) {
	resp, err := n.get(ctx, p, entryPath(id, BindVersion(digest, n.cfg.Self, p.Node), i, off, size))
	if err != nil {
		return nil, err
	}
	if resp.ContentLength != size {
		resp.Body.Close()
		return nil, fmt.Errorf("peer sends %d bytes for a piece of %d", resp.ContentLength, size)
	}
	return resp.Body, nil
}

// OpenBatch asks p for many pieces of a dataset version in one request (a peer whose Have has
// Batch set, for at most that many pieces; protocol.go). The bytes are not verified.
func (n *Network) OpenBatch(ctx context.Context, p Peer, id, digest string, pieces []Range) (*Batch, error) {
	if err := checkBatch(pieces); err != nil {
		return nil, err
	}
	body, err := json.Marshal(batchRequest{Pieces: pieces})
	if err != nil {
		return nil, err
	}
	resp, err := n.do(ctx, p, http.MethodPost, batchPath(id, BindVersion(digest, n.cfg.Self, p.Node)), body)
	if err != nil {
		return nil, err
	}
	if ct := resp.Header.Get("Content-Type"); ct != batchContentType {
		resp.Body.Close()
		return nil, fmt.Errorf("peer answers a batch with %q", ct)
	}
	return &Batch{body: resp.Body, r: bufio.NewReaderSize(resp.Body, 64<<10), pieces: pieces}, nil
}

// Batch is the answer to a batch request: the pieces asked for, in the order asked.
type Batch struct {
	body   io.ReadCloser
	r      *bufio.Reader
	pieces []Range
	next   int
	cur    io.LimitedReader
}

// Next returns the next piece asked for: a reader of exactly its N bytes, or held false when
// the peer does not hold it (any more). What was left unread of the previous piece is skipped.
// After the last piece it returns io.EOF; a short or malformed answer is an error, and the rest
// of the batch is to be read elsewhere.
func (b *Batch) Next() (r io.Reader, held bool, err error) {
	if b.cur.N > 0 {
		if _, err := io.Copy(io.Discard, &b.cur); err != nil {
			return nil, false, err
		}
		if b.cur.N > 0 {
			return nil, false, io.ErrUnexpectedEOF
		}
	}
	if b.next >= len(b.pieces) {
		return nil, false, io.EOF
	}
	var hdr [frameHeader]byte
	if _, err := io.ReadFull(b.r, hdr[:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, false, err
	}
	p := b.pieces[b.next]
	b.next++
	n := binary.BigEndian.Uint64(hdr[1:])
	switch {
	case hdr[0] == frameNotHeld && n == 0:
		return nil, false, nil
	case hdr[0] == frameHeld && n == uint64(p.N):
		b.cur = io.LimitedReader{R: b.r, N: p.N}
		return &b.cur, true, nil
	}
	return nil, false, fmt.Errorf("peer sent a bad frame for entry %d: status %d, %d bytes of %d", p.Index, hdr[0], n, p.N)
}

// Close ends the answer, read to its end or not.
func (b *Batch) Close() error { return b.body.Close() }

// Swarm is a fetcher's view of the peers of one dataset version: who holds which pieces, who is
// reading which from the source, who failed. It polls them while the fetcher works.
type Swarm struct {
	net         *Network
	id, digest  string
	stop        context.CancelFunc
	done        chan struct{}
	members     []string // nodes sharing the pieces out, by name (Offset, Owner)
	started     time.Time
	mu          sync.Mutex
	peers       map[string]*peerState // by address
	roundClosed chan struct{}         // closed after each poll round
}

type peerState struct {
	Peer
	have     *Have
	inflight int
	// retryAt: a peer that failed (unreachable, slow, gone) is left alone until then.
	retryAt time.Time
	// refusedUntil: a peer that refused a request for want of an upload slot is waited for.
	refusedUntil time.Time
	// polled is when have was last asked; notHeld: the peer does not hold the version (yet).
	polled  time.Time
	notHeld bool
}

// Swarm starts polling the peers of a dataset version; Close stops it.
func (n *Network) Swarm(ctx context.Context, id, digest string) *Swarm {
	ctx, stop := context.WithCancel(ctx)
	s := &Swarm{net: n, id: id, digest: digest, stop: stop, done: make(chan struct{}),
		peers: map[string]*peerState{}, roundClosed: make(chan struct{})}
	// The nodes staging together, as this node sees them when it starts: they share the pieces.
	s.started = time.Now()
	s.members = []string{n.cfg.Self}
	for _, p := range n.cfg.Directory.Peers(id) {
		if !slices.Contains(s.members, p.Node) {
			s.members = append(s.members, p.Node)
		}
	}
	slices.Sort(s.members)
	go s.run(ctx)
	return s
}

// Close stops polling.
func (s *Swarm) Close() {
	s.stop()
	<-s.done
}

func (s *Swarm) run(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.net.cfg.PollInterval)
	defer t.Stop()
	for {
		s.poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// poll refreshes the peer list and asks each peer not known to be ready what it holds.
func (s *Swarm) poll(ctx context.Context) {
	seen := map[string]bool{}
	for _, p := range s.net.cfg.Directory.Peers(s.id) {
		if p.Node == s.net.cfg.Self || p.Address == "" || p.CertHash == "" {
			continue
		}
		seen[p.Address] = true
		s.mu.Lock()
		if ps, ok := s.peers[p.Address]; !ok || ps.Peer != p {
			s.peers[p.Address] = &peerState{Peer: p}
		}
		s.mu.Unlock()
	}
	var wg sync.WaitGroup
	now := time.Now()
	s.mu.Lock()
	for addr, ps := range s.peers {
		switch {
		case !seen[addr]:
			delete(s.peers, addr)
		case ps.have != nil && ps.have.Ready, now.Before(ps.retryAt), s.net.isBanned(addr):
		default:
			p := ps.Peer
			wg.Go(func() {
				h, err := s.net.HaveOf(ctx, p, s.id, s.digest)
				s.mu.Lock()
				defer s.mu.Unlock()
				ps, ok := s.peers[p.Address]
				if !ok || ctx.Err() != nil {
					return
				}
				ps.polled = time.Now()
				var se *statusError
				switch {
				case err == nil:
					ps.have, ps.notHeld = h, false
				case errors.As(err, &se) && se.code == http.StatusNotFound:
					ps.have, ps.notHeld = nil, true
				default:
					klog.FromContext(ctx).V(3).Info("peer unreachable", "peer", p.Node, "err", err)
					ps.have, ps.retryAt = nil, time.Now().Add(5*time.Second)
				}
			})
		}
	}
	s.mu.Unlock()
	wg.Wait()
	s.mu.Lock()
	close(s.roundClosed)
	s.roundClosed = make(chan struct{})
	s.mu.Unlock()
}

// Choice is where a piece should come from.
type Choice int

const (
	// FromSource: no peer holds the piece or is fetching it.
	FromSource Choice = iota
	// FromPeer: a peer holds it.
	FromPeer
	// Wait: a peer is reading it from the source now; ask again after the next poll.
	Wait
)

// Pick chooses where [off, off+n) of entry i comes from: the least busy peer that holds it.
func (s *Swarm) Pick(i, off, n int64) (Peer, Choice) { return s.choose(i, off, n, true) }

func (s *Swarm) choose(i, off, n int64, take bool) (Peer, Choice) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var best []*peerState
	busy := false
	for addr, ps := range s.peers {
		if ps.have == nil || now.Before(ps.retryAt) || s.net.isBanned(addr) {
			continue
		}
		switch {
		case ps.have.Has(i, off, n) && now.Before(ps.refusedUntil):
			busy = true
		case ps.have.Has(i, off, n):
			if len(best) == 0 || ps.inflight < best[0].inflight {
				best = []*peerState{ps}
			} else if ps.inflight == best[0].inflight {
				best = append(best, ps)
			}
		case ps.have.IsBusy(i, off, n):
			busy = true
		}
	}
	if len(best) > 0 {
		ps := best[rand.IntN(len(best))]
		if take {
			ps.inflight++
		}
		return ps.Peer, FromPeer
	}
	if busy {
		return Peer{}, Wait
	}
	return Peer{}, FromSource
}

// PickBatch chooses the peer to ask for many pieces at once: among the peers that serve batches,
// the one that holds the most of them, the least busy of those first. held tells which pieces
// it holds (at most its Have.Batch of them). FromSource: no such peer holds any; Wait: those that
// do refused a request a moment ago.
func (s *Swarm) PickBatch(pieces []Range) (p Peer, held []bool, choice Choice) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var best []*peerState
	most, busy := 0, false
	for addr, ps := range s.peers {
		if ps.have == nil || ps.have.Batch <= 0 || now.Before(ps.retryAt) || s.net.isBanned(addr) {
			continue
		}
		k := 0
		for _, pc := range pieces {
			if ps.have.Has(pc.Index, pc.Off, pc.N) {
				k++
			}
		}
		k = min(k, ps.have.Batch)
		switch {
		case k == 0:
		case now.Before(ps.refusedUntil):
			busy = true
		case k > most || k == most && ps.inflight < best[0].inflight:
			most, best = k, []*peerState{ps}
		case k == most && ps.inflight == best[0].inflight:
			best = append(best, ps)
		}
	}
	if len(best) == 0 {
		if busy {
			return Peer{}, nil, Wait
		}
		return Peer{}, nil, FromSource
	}
	ps := best[rand.IntN(len(best))]
	ps.inflight++
	held = make([]bool, len(pieces))
	for k, pc := range pieces {
		if most > 0 && ps.have.Has(pc.Index, pc.Off, pc.N) {
			held[k] = true
			most--
		}
	}
	return ps.Peer, held, FromPeer
}

// HoldsBatch reports whether a peer that serves batches and may be asked holds [off, off+n) of
// entry i now.
func (s *Swarm) HoldsBatch(i, off, n int64) bool {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for addr, ps := range s.peers {
		if ps.have != nil && ps.have.Batch > 0 && !now.Before(ps.retryAt) && !s.net.isBanned(addr) && ps.have.Has(i, off, n) {
			return true
		}
	}
	return false
}

// OpenBatch asks p, which PickBatch chose, for pieces; Done or Refused must be called once the
// answer is read.
func (s *Swarm) OpenBatch(ctx context.Context, p Peer, pieces []Range) (*Batch, error) {
	return s.net.OpenBatch(ctx, p, s.id, s.digest, pieces)
}

// Staging reports whether node is a peer that is staging the version (it answers, not Ready):
// its share is left to it.
func (s *Swarm) Staging(node string) bool {
	if s.peerIs(node, func(h *Have) bool { return !h.Ready }) {
		return true
	}
	// A node the inventory listed when this one started may still be listing the version: it
	// is given a few polls to answer before its share is read from the source.
	if time.Since(s.started) >= 8*s.net.cfg.PollInterval || !slices.Contains(s.members, node) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ps := range s.peers {
		if ps.Node == node && (ps.have == nil || !ps.have.Ready) && !time.Now().Before(ps.retryAt) {
			return true
		}
	}
	return false
}

// Fetching reports whether node is a peer that is reading from the source now (it has pieces of
// its share to go): worth waiting for, rather than reading its pieces from the source too.
func (s *Swarm) Fetching(node string) bool {
	return s.peerIs(node, func(h *Have) bool { return !h.Ready && len(h.Busy) > 0 })
}

// FetchingPeers is the number of other members reading from the source now (Fetching).
func (s *Swarm) FetchingPeers() int {
	n := 0
	for _, m := range s.members {
		if m != s.net.cfg.Self && s.Fetching(m) {
			n++
		}
	}
	return n
}

func (s *Swarm) peerIs(node string, is func(*Have) bool) bool {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for addr, ps := range s.peers {
		if ps.Node == node && ps.have != nil && is(ps.have) && !now.Before(ps.retryAt) && !s.net.isBanned(addr) {
			return true
		}
	}
	return false
}

// Holds reports whether a peer that may be asked holds [off, off+n) of entry i now.
func (s *Swarm) Holds(i, off, n int64) bool {
	_, choice := s.choose(i, off, n, false)
	return choice == FromPeer
}

// Busy reports whether no peer that may be asked holds [off, off+n) of entry i but one is reading
// it from the source now.
func (s *Swarm) Busy(i, off, n int64) bool {
	_, choice := s.choose(i, off, n, false)
	return choice == Wait
}

// Polled returns a channel closed after the next poll round.
func (s *Swarm) Polled() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.roundClosed
}

// Open reads a piece Pick chose from p. Done must be called once the read is over, with whether
// it failed (not verified: Wrong is for that).
func (s *Swarm) Open(ctx context.Context, p Peer, i, off, n int64) (io.ReadCloser, error) {
	return s.net.OpenPiece(ctx, p, s.id, s.digest, i, off, n)
}

// Done ends a read of a piece from p; failed leaves p alone for a while (unreachable, slow,
// refused, or it stopped holding the piece).
func (s *Swarm) Done(p Peer, failed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ps, ok := s.peers[p.Address]
	if !ok {
		return
	}
	ps.inflight = max(ps.inflight-1, 0)
	if failed {
		ps.retryAt = time.Now().Add(5 * time.Second)
		ps.have = nil
	}
}

// Refused ends a request p refused for want of an upload slot (IsBusy): p is asked again after
// a poll interval.
func (s *Swarm) Refused(p Peer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ps, ok := s.peers[p.Address]; ok {
		ps.inflight = max(ps.inflight-1, 0)
		ps.refusedUntil = time.Now().Add(s.net.cfg.PollInterval / 2)
	}
}

// IsBusy reports whether a peer refused a request because it sends all it may at once.
func IsBusy(err error) bool {
	var se *statusError
	return errors.As(err, &se) && se.code == http.StatusServiceUnavailable
}

// Wrong records that p served bytes that failed verification: it is not asked again, by this
// swarm or any other, for the network's BanFor.
func (s *Swarm) Wrong(p Peer) {
	s.net.ban(p.Address)
	s.mu.Lock()
	defer s.mu.Unlock()
	if ps, ok := s.peers[p.Address]; ok {
		ps.have = nil
	}
}
