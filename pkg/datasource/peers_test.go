package datasource_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// tokens is an Authenticator that knows a fixed set of tokens (TokenReview in the driver).
type tokens map[string]string

func (t tokens) Authenticate(_ context.Context, token string) (string, error) {
	if node, ok := t[token]; ok {
		return node, nil
	}
	if node, ok := strings.CutPrefix(token, "token-"); ok && node != "" {
		return node, nil
	}
	return "", peer.ErrUnauthenticated
}

// peers is a Directory that lists fixed peers for every dataset.
type peers []peer.Peer

func (p *peers) Peers(string) []peer.Peer { return *p }

// startPeer serves store on a loopback port as node, for clients presenting "token-<any>".
func startPeer(t *testing.T, node string, store peer.Store) peer.Peer {
	return startPeerWith(t, node, peer.ServerConfig{Store: store})
}

func startPeerWith(t *testing.T, node string, cfg peer.ServerConfig) peer.Peer {
	return startPeerWrapped(t, node, cfg, nil)
}

// startPeerWrapped serves the peer port's handler through wrap, when set, as Serve would.
func startPeerWrapped(t *testing.T, node string, cfg peer.ServerConfig, wrap func(http.Handler) http.Handler) peer.Peer {
	t.Helper()
	cert, hash, err := peer.SelfSigned(node)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Auth, cfg.Cert, cfg.Self = tokens{}, cert, node
	srv, err := peer.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	if wrap == nil {
		go func() { defer close(done); _ = srv.Serve(ctx, l) }()
	} else {
		hs := &http.Server{Handler: wrap(srv.Handler()), TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
		go func() { defer close(done); _ = hs.ServeTLS(l, "", "") }()
		go func() { <-ctx.Done(); hs.Close() }()
	}
	t.Cleanup(func() { cancel(); <-done })
	return peer.Peer{Node: node, Address: l.Addr().String(), CertHash: hash}
}

// requests counts what fetchers ask a peer port: batches, and small entries asked one by one.
type requests struct {
	batches, smallPieces atomic.Int64
}

func (c *requests) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/batch"):
			c.batches.Add(1)
		case strings.Contains(r.URL.Path, "/entries/"):
			// Whole small entries; a large entry's ranges are 2 MiB, but its last.
			if n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64); n < 1<<20 && r.URL.Query().Get("off") == "0" {
				c.smallPieces.Add(1)
			}
		}
		h.ServeHTTP(w, r)
	})
}

// earlierVersion makes a peer port look like one of an earlier version, which serves no
// batches: its "have" answers say nothing of them, and a batch request finds nothing.
func earlierVersion(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/batch"):
			http.NotFound(w, r)
		case strings.HasSuffix(r.URL.Path, "/have"):
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			var have map[string]any
			if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &have) != nil {
				w.WriteHeader(rec.Code)
				w.Write(rec.Body.Bytes())
				return
			}
			delete(have, "batch")
			json.NewEncoder(w).Encode(have)
		default:
			h.ServeHTTP(w, r)
		}
	})
}

func network(t *testing.T, self, token string, dir peer.Directory) *peer.Network {
	t.Helper()
	n, err := peer.NewNetwork(peer.NetworkConfig{Self: self, Directory: dir,
		Token: func() (string, error) { return token, nil }})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// corrupting serves what store holds with one byte flipped in the pieces bad chooses.
type corrupting struct {
	peer.Store
	bad    func(i, off, n int64) bool
	served atomic.Int64
}

func (c *corrupting) Open(id, digest string, i, off, n int64) (io.ReadCloser, error) {
	rc, err := c.Store.Open(id, digest, i, off, n)
	if err != nil || !c.bad(i, off, n) {
		return rc, err
	}
	c.served.Add(1)
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		return nil, err
	}
	b[len(b)/2] ^= 0x40
	return io.NopCloser(strings.NewReader(string(b))), nil
}

// spying counts the requests a store answers.
type spying struct {
	peer.Store
	calls atomic.Int64
}

func (s *spying) Have(id, digest string) (*peer.Have, bool) {
	s.calls.Add(1)
	return s.Store.Have(id, digest)
}

func (s *spying) Open(id, digest string, i, off, n int64) (io.ReadCloser, error) {
	s.calls.Add(1)
	return s.Store.Open(id, digest, i, off, n)
}

// fetched returns the bytes staging counted from origin.
func fetched(t *testing.T, m *datasource.Manager, origin string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != "cistern_dataset_fetched_bytes_total" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			if label(mt, "origin") == origin {
				sum += mt.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// counter returns the value of an unlabelled counter.
func counter(t *testing.T, m *datasource.Manager, name string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("the manager exports no %s", name)
	return 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestPeerFanout stages a dataset on node a from S3, then on node b from a: b reads (almost)
// nothing from S3, a peer that serves wrong bytes is caught and b's data is still byte-identical,
// and a peer that is gone costs nothing but the source reads.
func TestPeerFanout(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	want := smallTree(7, 40, 5000)
	want.upload(t, s, "data", "set/")
	single := randBytes(71, 7<<20+1) // ranges, checked by a full-object CRC or the MD5 ETag
	s.Put(t, "data", "set/big/single.bin", single)
	want["big/single.bin"] = single
	multi := randBytes(72, 12<<20+5) // part-aligned ranges, checked by the parts' MD5s
	s.PutMultipart(t, "data", "set/big/multi.bin", int64(len(multi)), 5<<20, func(i int, buf []byte) { copy(buf, multi[i*(5<<20):]) })
	want["big/multi.bin"] = multi

	for _, mode := range []struct {
		name string
		base testpeers.Fault
	}{
		{"MD5 ETags only", testpeers.Fault{ResetAfter: -1, StripChecksums: true}},
		{"with S3 checksums", testpeers.None},
		// No checksums, no part sizes: multi.bin is checked under the part sizes inferred.
		{"old S3 server", testpeers.LegacyS3(nil, 0)},
	} {
		name := mode.name
		t.Run(name, func(t *testing.T) {
			var gets, heads atomic.Int64
			proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
				if r.Method == http.MethodGet && !r.URL.Query().Has("list-type") {
					gets.Add(1)
				}
				if r.Method == http.MethodHead {
					heads.Add(1)
				}
				return mode.base
			})
			spec := mustSpec(t, s3Params(s, proxy.URL, "s3://data/set"))
			// Low watermarks: the test pools share a disk other work fills.
			cfg := datasource.Config{Concurrency: 4, ChunkSize: 2 << 20, LowWatermark: 0.001, HighWatermark: 0.002}
			a := newManager(t, cfg)
			poolA := t.TempDir()
			if _, err := stage(ctx, t, a, datasource.Request{Spec: spec, Creds: creds(s), Pool: poolA}); err != nil {
				t.Fatal(err)
			}
			fromS3 := gets.Load()

			// fromPeer stages the dataset on a new node whose one peer, "a", serves store (as a node
			// of an earlier version, without batches, when earlier), checks the tree, and returns
			// the node and the requests the peer saw.
			fromPeer := func(t *testing.T, node string, store peer.Store, earlier bool) (*datasource.Manager, *requests) {
				t.Helper()
				reqs := &requests{}
				wrap := reqs.wrap
				if earlier {
					wrap = func(h http.Handler) http.Handler { return reqs.wrap(earlierVersion(h)) }
				}
				pa := startPeerWrapped(t, "a", peer.ServerConfig{Store: store}, wrap)
				cfg := cfg
				cfg.Peers = network(t, node, "token-"+node, &peers{pa})
				m := newManager(t, cfg)
				pool := t.TempDir()
				if _, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}); err != nil {
					t.Fatal(err)
				}
				tree, err := m.TreePath(pool, spec)
				if err != nil {
					t.Fatal(err)
				}
				checkTree(t, tree, want)
				return m, reqs
			}

			for _, tc := range []struct {
				name    string
				earlier bool
			}{
				// Small entries come in batches; a large entry's ranges one by one.
				{name: "honest peer"},
				// A peer of an earlier version serves every piece one by one.
				{name: "honest peer of an earlier version, without batches", earlier: true},
			} {
				t.Run(tc.name, func(t *testing.T) {
					before, headsBefore := gets.Load(), heads.Load()
					b, reqs := fromPeer(t, "b", a, tc.earlier)
					// The caller proves it may read every file (a HEAD each) before any peer is
					// asked, and reads no object from S3.
					if n := gets.Load() - before; n != 0 {
						t.Errorf("b made %d object GETs to S3 (a made %d), want none", n, fromS3)
					}
					if n := heads.Load() - headsBefore; n < int64(len(want)) {
						t.Errorf("b made %d HEADs to S3, want one at least per file (%d)", n, len(want))
					}
					if got := fetched(t, b, "peer"); got != float64(sumSizes(want)) {
						t.Errorf("b counted %v bytes from peers, want %d", got, sumSizes(want))
					}
					batches, small := reqs.batches.Load(), reqs.smallPieces.Load()
					if tc.earlier && (batches != 0 || small == 0) || !tc.earlier && (batches == 0 || small != 0) {
						t.Errorf("%d batch requests, %d small pieces asked one by one", batches, small)
					}
				})
			}

			for _, tc := range []struct {
				name    string
				bad     func(i, off, n int64) bool
				earlier bool
			}{
				// Whole entries come in batches, each checked on its own against its MD5 ETag:
				// the first wrong one drops the peer, and it and the rest of the batch are read
				// from S3.
				{name: "corrupt peer - whole entries in a batch", bad: func(i, _, n int64) bool { return i%3 == 0 && n < 1<<20 }},
				// The same, from a peer that sends them one by one.
				{name: "corrupt peer of an earlier version - whole entries", bad: func(i, _, n int64) bool { return i%3 == 0 && n < 1<<20 }, earlier: true},
				// Ranges are checked with their entry: the peer's ranges are read again from S3
				// to find the wrong one.
				{name: "corrupt peer - one range of a large entry", bad: func(_, off, n int64) bool { return n >= 1<<20 && off > 0 }},
			} {
				t.Run(tc.name, func(t *testing.T) {
					bad := &corrupting{Store: a, bad: tc.bad}
					c, reqs := fromPeer(t, "c", bad, tc.earlier)
					if bad.served.Load() == 0 {
						t.Fatal("the corrupt peer served nothing: nothing was tested")
					}
					if got := counter(t, c, "cistern_dataset_peer_wrong_pieces_total"); got < 1 {
						t.Errorf("%v wrong pieces counted", got)
					}
					if fetched(t, c, "source") == 0 {
						t.Error("the wrong pieces were not read again from the source")
					}
					if batches := reqs.batches.Load(); tc.earlier != (batches == 0) {
						t.Errorf("%d batch requests", batches)
					}
				})
			}

			t.Run("failure case - caller may list but not read", func(t *testing.T) {
				// The caller proves it reads the data with its own credentials before any peer
				// is asked: denied, it is told so, and the peer hears nothing from it. (S3
				// authorizes HEAD as GetObject.)
				denied := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
					if (r.Method == http.MethodGet || r.Method == http.MethodHead) && !r.URL.Query().Has("list-type") {
						return testpeers.Fault{Status: http.StatusForbidden, Code: "AccessDenied", ResetAfter: -1}
					}
					return mode.base
				})
				spy := &spying{Store: a}
				pa := startPeer(t, "a", spy)
				cfg := cfg
				cfg.Peers = network(t, "e", "token-e", &peers{pa})
				e := newManager(t, cfg)
				spec := mustSpec(t, s3Params(s, denied.URL, "s3://data/set"))
				_, err := stage(ctx, t, e, datasource.Request{Spec: spec, Creds: creds(s), Pool: t.TempDir()})
				if datasource.Code(err) != codes.PermissionDenied {
					t.Fatalf("got %v (%v), want PermissionDenied", datasource.Code(err), err)
				}
				if n := spy.calls.Load(); n != 0 {
					t.Fatalf("the peer was asked %d times", n)
				}
			})

			t.Run("swarm", func(t *testing.T) {
				// Two nodes stage together, each serving the other what it has: both end with
				// the same bytes. The second starts once the first has read a quarter of the
				// dataset from S3, so it has pieces to take from a peer however loaded the
				// machine is (started at the same instant, each may read its partner's share
				// itself once its patience ends; how much nodes starting together read from S3
				// is what make bench-fanout measures).
				var ms [2]*datasource.Manager
				var ps [2]peer.Peer
				dirs := [2]*peers{{}, {}}
				for k, node := range []string{"f", "g"} {
					cfg := cfg
					cfg.Peers = network(t, node, "token-"+node, dirs[k])
					ms[k] = newManager(t, cfg)
					ps[k] = startPeer(t, node, ms[k])
				}
				*dirs[0], *dirs[1] = peers{ps[1]}, peers{ps[0]}
				slow := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
					if r.Method == http.MethodGet && !r.URL.Query().Has("list-type") {
						f := mode.base
						f.Delay = 20 * time.Millisecond
						return f
					}
					return mode.base
				})
				spec := mustSpec(t, s3Params(s, slow.URL, "s3://data/set"))
				var wg sync.WaitGroup
				pools := [2]string{t.TempDir(), t.TempDir()}
				for k := range ms {
					wg.Go(func() {
						if _, err := stage(ctx, t, ms[k], datasource.Request{Spec: spec, Creds: creds(s), Pool: pools[k]}); err != nil {
							t.Error(err)
						}
					})
					for deadline := time.Now().Add(time.Minute); k == 0 && fetched(t, ms[0], "source") < float64(sumSizes(want))/4; {
						if time.Now().After(deadline) {
							t.Fatal("the first node read less than a quarter of the dataset from S3 in a minute")
						}
						time.Sleep(10 * time.Millisecond)
					}
				}
				wg.Wait()
				for k := range ms {
					tree, err := ms[k].TreePath(pools[k], spec)
					if err != nil {
						t.Fatal(err)
					}
					checkTree(t, tree, want)
				}
				// They must have exchanged data: a swarm whose nodes each read everything from
				// S3 would pass the check above.
				var fromS3, fromPeers float64
				for k := range ms {
					s3, p := fetched(t, ms[k], "source"), fetched(t, ms[k], "peer")
					t.Logf("node %d: %v bytes from S3, %v from its peer", k, s3, p)
					fromS3, fromPeers = fromS3+s3, fromPeers+p
				}
				if fromPeers == 0 || fromS3 >= 2*float64(sumSizes(want)) {
					t.Errorf("the nodes exchanged nothing: %v bytes from peers, %v from S3 for two copies of %d", fromPeers, fromS3, sumSizes(want))
				}
			})

			t.Run("busy peer", func(t *testing.T) {
				// A peer that sends one piece at a time refuses the others at once: they are
				// asked again, not read from S3.
				pa := startPeerWith(t, "a", peer.ServerConfig{Store: a, MaxUploads: 1, QueueWait: time.Millisecond})
				cfg := cfg
				cfg.Peers = network(t, "h", "token-h", &peers{pa})
				h := newManager(t, cfg)
				pool := t.TempDir()
				before := gets.Load()
				if _, err := stage(ctx, t, h, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}); err != nil {
					t.Fatal(err)
				}
				tree, err := h.TreePath(pool, spec)
				if err != nil {
					t.Fatal(err)
				}
				checkTree(t, tree, want)
				if n := gets.Load() - before; n != 0 {
					t.Errorf("h made %d object GETs to S3, want none (its access proof is a HEAD per file)", n)
				}
			})

			t.Run("peer gone", func(t *testing.T) {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				gone := peer.Peer{Node: "gone", Address: l.Addr().String(), CertHash: strings.Repeat("0", 64)}
				l.Close()
				cfg := cfg
				cfg.Peers = network(t, "d", "token-d", &peers{gone})
				d := newManager(t, cfg)
				pool := t.TempDir()
				if _, err := stage(ctx, t, d, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}); err != nil {
					t.Fatal(err)
				}
				tree, err := d.TreePath(pool, spec)
				if err != nil {
					t.Fatal(err)
				}
				checkTree(t, tree, want)
			})
		})
	}
}
