package datasource_test

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// Partial readers (issue 24, item 1): a bucket policy lets the anonymous tenant list the bucket
// and read one of its 21 objects. A proof that samples one file lets a tenant who retries draw
// the readable one sooner or later (a probe was served within 1-47 attempts); these tests retry
// far more often than that.

const partialRetries = 100

// partialBucket uploads 21 objects under set/ of bucket "shared", of which the anonymous tenant
// may read only the one named readable.
func partialBucket(t *testing.T, s *testpeers.S3) (dataset, string) {
	t.Helper()
	s.Bucket(t, "shared")
	want := smallTree(24, 21, 300)
	want.upload(t, s, "shared", "set/")
	readable := ""
	for k := range want {
		readable = k
		break
	}
	bucketPolicy(t, s, "shared", anonymousList("shared"), anonymousRead("shared", "set/"+readable))
	return want, readable
}

// anonymousRequests counts what reaches the server without credentials.
func anonymousRequests(n *atomic.Int64) func(r *http.Request, _ int64) testpeers.Fault {
	return func(r *http.Request, _ int64) testpeers.Fault {
		if r.Header.Get("Authorization") == "" && r.URL.Query().Get("X-Amz-Credential") == "" {
			n.Add(1)
		}
		return testpeers.None
	}
}

// TestPartialReaderNeverServedCache: a cache hit needs the caller to read every file. The
// tenant who may read one of 21 is refused on each of 100 attempts, and after the first the
// refusal is remembered: retries send the server nothing.
func TestPartialReaderNeverServedCache(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	partialBucket(t, s)
	var anon atomic.Int64
	proxy := testpeers.StartProxy(t, s.Endpoint, anonymousRequests(&anon))
	pool := t.TempDir()
	// One check at a time: with more, checks the first refusal cancelled may already be on
	// their way to the server and reach the proxy after the attempt returned (a straggler of
	// the first attempt, not a retry; seen on a loaded machine).
	m := newManager(t, datasource.Config{Concurrency: 1, AccessProofTTL: time.Minute})
	spec := mustSpec(t, s3Params(s, proxy.URL, "s3://shared/set"))
	if _, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}); err != nil {
		t.Fatal(err)
	}
	tenant := datasource.Request{Spec: spec, Pool: pool}
	var afterFirst int64
	for i := range partialRetries {
		st, err := m.Wait(ctx, tenant)
		if st.Ready() || err == nil {
			t.Fatalf("attempt %d: the partial reader was served the cached dataset (%v)", i+1, st)
		}
		wantCode(t, err, codes.PermissionDenied)
		if i == 0 {
			afterFirst = anon.Load()
		}
	}
	if afterFirst == 0 {
		t.Fatal("the first attempt asked the server nothing")
	}
	if n := anon.Load() - afterFirst; n != 0 {
		t.Errorf("%d requests to the server after the first refusal, want 0 (the refusal is remembered)", n)
	}
	// The tenant's own first refusal did not touch the administrator's proof.
	if st, err := m.Wait(ctx, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}); err != nil || !st.Ready() {
		t.Fatalf("the reader of every file: %v %v", st, err)
	}
}

// TestPartialReaderNotServedByPeers: a node staging for the partial reader takes nothing from
// a peer that holds the dataset, however often it retries: the peer is never asked, and no tree
// appears.
func TestPartialReaderNotServedByPeers(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	partialBucket(t, s)
	spec := mustSpec(t, s3Params(s, "", "s3://shared/set"))
	cfg := datasource.Config{Concurrency: 4, LowWatermark: 0.001, HighWatermark: 0.002}
	a := newManager(t, cfg)
	if _, err := stage(ctx, t, a, datasource.Request{Spec: spec, Creds: creds(s), Pool: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	spy := &spying{Store: a}
	pa := startPeer(t, "a", spy)
	cfg.Peers = network(t, "b", "token-b", &peers{pa})
	b := newManager(t, cfg)
	pool := t.TempDir()
	tenant := datasource.Request{Spec: spec, Pool: pool}
	for i := range partialRetries {
		st, err := b.Wait(ctx, tenant)
		if err == nil || st.Ready() {
			t.Fatalf("attempt %d: the partial reader was staged the dataset (%v, %v)", i+1, st, err)
		}
		wantCode(t, err, codes.PermissionDenied)
	}
	if n := spy.calls.Load(); n != 0 {
		t.Errorf("the peer was asked %d times for the partial reader", n)
	}
	if tree, err := b.TreePath(pool, spec); err == nil {
		t.Fatalf("a tree was published for the partial reader: %s", tree)
	}
}
