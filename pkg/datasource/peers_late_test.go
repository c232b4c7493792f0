package datasource_test

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// latePeers is a directory that lists its peers only once opened, as the StoragePool inventory
// lists a node only after its pool reports the dataset.
type latePeers struct {
	mu     sync.Mutex
	open   bool
	listed []peer.Peer
}

func (l *latePeers) Peers(string) []peer.Peer {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.open {
		return nil
	}
	return l.listed
}

func (l *latePeers) list() {
	l.mu.Lock()
	l.open = true
	l.mu.Unlock()
}

// A node that knows no peer when it starts staging joins the swarm as soon as the inventory lists
// one, after its caller proved it may read every file, and takes the rest from the peer.
func TestPeerLearnedWhileStaging(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	want := smallTree(11, 60, 5000)
	want.upload(t, s, "data", "set/")
	big := randBytes(12, 9<<20+3) // ranges
	s.Put(t, "data", "set/big.bin", big)
	want["big.bin"] = big

	// Once a staged the set, S3 answers each object GET after 100 ms (b's), so that b's staging
	// is still under way when it learns of a.
	var slow atomic.Bool
	var gets, heads, headsAtFirstPeerRequest atomic.Int64
	firstGet := make(chan struct{})
	var once sync.Once
	proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if !slow.Load() {
			return testpeers.None
		}
		switch {
		case r.Method == http.MethodHead:
			heads.Add(1)
		case r.Method == http.MethodGet && !r.URL.Query().Has("list-type"):
			gets.Add(1)
			once.Do(func() { close(firstGet) })
			return testpeers.Fault{ResetAfter: -1, Delay: 100 * time.Millisecond}
		}
		return testpeers.None
	})
	spec := mustSpec(t, s3Params(s, proxy.URL, "s3://data/set"))
	cfg := datasource.Config{Concurrency: 4, ChunkSize: 1 << 20, LowWatermark: 0.001, HighWatermark: 0.002}
	a := newManager(t, cfg)
	poolA := t.TempDir()
	if _, err := stage(ctx, t, a, datasource.Request{Spec: spec, Creds: creds(s), Pool: poolA}); err != nil {
		t.Fatal(err)
	}
	slow.Store(true)

	headsAtFirstPeerRequest.Store(-1)
	pa := startPeerWrapped(t, "a", peer.ServerConfig{Store: a}, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			headsAtFirstPeerRequest.CompareAndSwap(-1, heads.Load())
			h.ServeHTTP(w, r)
		})
	})
	dir := &latePeers{listed: []peer.Peer{pa}}
	cfg.Peers = network(t, "b", "token-b", dir)
	b := newManager(t, cfg)
	poolB := t.TempDir()
	staged := make(chan error, 1)
	go func() {
		_, err := stage(ctx, t, b, datasource.Request{Spec: spec, Creds: creds(s), Pool: poolB})
		staged <- err
	}()
	select {
	case <-firstGet: // b is fetching, alone
	case err := <-staged:
		t.Fatalf("b staged (err %v) before its first object GET", err)
	}
	dir.list()
	if err := <-staged; err != nil {
		t.Fatal(err)
	}
	tree, err := b.TreePath(poolB, spec)
	if err != nil {
		t.Fatal(err)
	}
	checkTree(t, tree, want)

	files := int64(len(want))
	if n := headsAtFirstPeerRequest.Load(); n < files {
		t.Errorf("a was first asked after %d HEADs of b's caller, want one at least per file (%d) before", n, files)
	}
	fromPeer, fromS3 := fetched(t, b, "peer"), fetched(t, b, "source")
	if fromPeer == 0 {
		t.Errorf("b took nothing from a (%v bytes from S3 in %d GETs)", fromS3, gets.Load())
	}
	if total := float64(sumSizes(want)); fromPeer+fromS3 < total {
		t.Errorf("b fetched %v bytes from a and %v from S3, want %v at least", fromPeer, fromS3, total)
	}
	t.Logf("b: %v bytes from a, %v from S3 in %d object GETs", fromPeer, fromS3, gets.Load())
}
