package datasource_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/datasource"
	cparams "github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// Tenant A holds the server's credentials; tenant B is anonymous. Each test shows B is never
// handed A's data on one path.

func bucketPolicy(t *testing.T, s *testpeers.S3, bucket string, statements ...string) {
	t.Helper()
	policy := `{"Version":"2012-10-17","Statement":[` + strings.Join(statements, ",") + `]}`
	if _, err := s.Client.PutBucketPolicy(context.Background(), &s3.PutBucketPolicyInput{
		Bucket: aws.String(bucket), Policy: aws.String(policy)}); err != nil {
		t.Fatal(err)
	}
}

// anonymousList lets anyone list the bucket (not read its objects).
func anonymousList(bucket string) string {
	return `{"Effect":"Allow","Principal":"*","Action":["s3:ListBucket"],"Resource":["arn:aws:s3:::` + bucket + `"]}`
}

func anonymousRead(bucket, key string) string {
	return `{"Effect":"Allow","Principal":"*","Action":["s3:GetObject"],"Resource":["arn:aws:s3:::` + bucket + `/` + key + `"]}`
}

func wantCode(t *testing.T, err error, code codes.Code) {
	t.Helper()
	if datasource.Code(err) != code {
		t.Fatalf("got %v (%v), want %v", datasource.Code(err), err, code)
	}
}

// TestJoinProvesAccess: a caller without credentials does not join another tenant's staging of
// a private bucket, neither while it runs nor once it is cached.
func TestJoinProvesAccess(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "private")
	want := smallTree(7, 12, 1000)
	want.upload(t, s, "private", "set/")
	// Slow object reads keep A's staging running.
	proxy := testpeers.StartProxy(t, s.Endpoint, delayObjects(300*time.Millisecond))
	pool := t.TempDir()
	m := newManager(t, datasource.Config{Concurrency: 1, AccessProofTTL: time.Minute})
	spec := mustSpec(t, s3Params(s, proxy.URL, "s3://private/set"))
	a := datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}
	b := datasource.Request{Spec: spec, Pool: pool}

	if _, err := m.Ensure(ctx, a); err != nil {
		t.Fatal(err)
	}
	// A's staging must be under way; if it failed instead (a pool short of space refuses it),
	// say so now rather than wait for the package's timeout.
	for {
		st, _, _ := m.Status(pool, spec)
		if st.Phase == datasource.PhaseFetching {
			break
		}
		if st.Phase == datasource.PhaseFailed || ctx.Err() != nil {
			_, err := m.Wait(ctx, a)
			t.Fatalf("A's staging never started fetching: phase %q, %v", st.Phase, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	st, err := m.Wait(ctx, b)
	wantCode(t, err, codes.PermissionDenied)
	if st.Ready() || st.BytesTotal != 0 {
		t.Fatalf("the denied caller was told %v", st)
	}
	// Metrics name datasets by ID: whoever reads them learns no tenant's bucket.
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collector())
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	progress := 0
	for _, f := range families {
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "source" || strings.Contains(l.GetValue(), "private") {
					t.Errorf("%s has label %s=%q", f.GetName(), l.GetName(), l.GetValue())
				}
			}
			if f.GetName() == "cistern_dataset_staging_bytes" {
				progress++
			}
		}
	}
	if progress != 1 {
		t.Errorf("%d staging progress series, want 1", progress)
	}
	proxy.SetFaults(nil)
	if _, err := stage(ctx, t, m, a); err != nil {
		t.Fatal(err)
	}
	_, err = m.Wait(ctx, b)
	wantCode(t, err, codes.PermissionDenied)
	tree, _ := m.TreePath(pool, spec)
	checkTree(t, tree, want)
}

// TestListWithoutReadDenied: listing rights are not read rights. A caller that may list the
// bucket but not read its objects is not served the cache.
func TestListWithoutReadDenied(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	smallTree(8, 5, 100).upload(t, s, "data", "set/")
	bucketPolicy(t, s, "data", anonymousList("data"))
	pool := t.TempDir()
	m := newManager(t, datasource.Config{AccessProofTTL: time.Minute})
	spec := mustSpec(t, s3Params(s, "", "s3://data/set"))
	if _, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}); err != nil {
		t.Fatal(err)
	}
	_, err := m.Wait(ctx, datasource.Request{Spec: spec, Pool: pool})
	wantCode(t, err, codes.PermissionDenied)
}

// TestFailureNotReportedToOthers: one tenant's failed attempt is not the next tenant's answer.
func TestFailureNotReportedToOthers(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	want := smallTree(9, 4, 100)
	want.upload(t, s, "data", "set/")
	pool := t.TempDir()
	m := newManager(t, datasource.Config{})
	spec := mustSpec(t, s3Params(s, "", "s3://data/set"))
	bad := datasource.Request{Spec: spec, Pool: pool,
		Creds: datasource.Credentials{AccessKeyID: s.AccessKey, SecretAccessKey: "wrong"}}
	if _, err := m.Ensure(ctx, bad); err != nil {
		t.Fatal(err)
	}
	for { // the failed attempt is over, its failure not yet told to its caller
		if _, known, _ := m.Status(pool, spec); !known {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	st, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool})
	if err != nil || !st.Ready() {
		t.Fatalf("the second tenant got %v, %v", st, err)
	}
	_, err = m.Wait(ctx, bad)
	wantCode(t, err, codes.PermissionDenied)
}

// TestSourceChangedRestages: a caller whose listing differs from the cache (the source changed)
// gets a fresh staging of what it sees, in a new version; the old version is kept beside it, and
// a volume on it keeps it.
func TestSourceChangedRestages(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	old := smallTree(10, 6, 500)
	old.upload(t, s, "data", "set/")
	pool := t.TempDir()
	m := newManager(t, datasource.Config{}) // every hit lists
	spec := mustSpec(t, s3Params(s, "", "s3://data/set"))
	req := datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}
	st1, err := stage(ctx, t, m, req)
	if err != nil {
		t.Fatal(err)
	}
	oldTree, err := m.Acquire(pool, spec, st1.Version, "vol-old")
	if err != nil {
		t.Fatal(err)
	}

	cur := dataset{}
	for k, v := range old {
		cur[k] = v
	}
	for k := range cur {
		cur[k] = []byte("changed " + k)
		s.Put(t, "data", "set/"+k, cur[k])
		break
	}
	st2, err := stage(ctx, t, m, req)
	if err != nil {
		t.Fatal(err)
	}
	if st2.CacheHit || st2.Version == st1.Version {
		t.Fatalf("changed source served from the cache: %+v", st2)
	}
	newTree, err := m.Acquire(pool, spec, st2.Version, "vol-new")
	if err != nil {
		t.Fatal(err)
	}
	checkTree(t, newTree, cur)
	// The old version moved aside, kept under its digest, with vol-old's reference.
	entries, _ := filepath.Glob(filepath.Join(pool, datasource.CacheDirName, spec.ID()+".version-"+st1.Version))
	if len(entries) != 1 {
		t.Fatalf("kept versions: %v", entries)
	}
	if tree, err := m.Referenced(pool, spec.ID(), "vol-old"); err != nil || tree != filepath.Join(entries[0], "tree") {
		t.Fatalf("vol-old's tree: %s %v, want the kept version's", tree, err)
	}
	checkTree(t, filepath.Join(entries[0], "tree"), old) // what vol-old's bind mount shows
	_ = oldTree
	if err := m.ReleaseID(pool, spec.ID(), "vol-old"); err != nil {
		t.Fatal(err)
	}
	if !exists(entries[0]) {
		t.Fatal("the kept version went with its last reference; it stays cached for callers who see it")
	}
	if st3, err := stage(ctx, t, m, req); err != nil || !st3.CacheHit || st3.Version != st2.Version {
		t.Fatalf("unchanged source: %+v %v", st3, err)
	}
}

// TestResumeProvesAccess: a partial staging left by one tenant is resumed for another only if
// that caller reads the same data. Here the anonymous caller may read nothing but the one empty
// object A's attempt did not get; resuming would hand it A's private files.
func TestResumeProvesAccess(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	smallTree(11, 8, 200).upload(t, s, "data", "set/")
	s.Put(t, "data", "set/zz-public", nil)
	bucketPolicy(t, s, "data", anonymousList("data"), anonymousRead("data", "set/zz-public"))
	pool := t.TempDir()
	spec := mustSpec(t, s3Params(s, "", "s3://data/set"))
	if _, err := stage(ctx, t, newManager(t, datasource.Config{}), datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}); err != nil {
		t.Fatal(err)
	}
	// Make it A's interrupted attempt: everything staged but the public object, not published.
	dir := filepath.Join(pool, datasource.CacheDirName, spec.ID())
	if err := os.Rename(filepath.Join(dir, "tree"), filepath.Join(dir, "staging")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "staging", "zz-public")); err != nil {
		t.Fatal(err)
	}
	m2 := newManager(t, datasource.Config{}) // a restarted node plugin
	_, err := stage(ctx, t, m2, datasource.Request{Spec: spec, Pool: pool})
	wantCode(t, err, codes.PermissionDenied)
	if tree, err := m2.TreePath(pool, spec); err == nil {
		t.Fatalf("the partial staging was completed for the anonymous caller: %s", tree)
	}
}

// TestNFSInlineNeedsAllowList: an inline volume (any pod author writes one) may name an NFS
// server only when the administrator allows it.
func TestNFSInlineNeedsAllowList(t *testing.T) {
	testpeers.EachNFSServer(t, func(t *testing.T, srv testpeers.NFSServer) {
		ctx := testCtx(t)
		export := t.TempDir()
		want := smallTree(12, 3, 100)
		want.writeDir(t, filepath.Join(export, "data"))
		exp := srv.Start(t, export)
		params := map[string]string{"source": exp.URL("data")}
		parsed, err := cparams.Parse(params, cparams.Inline)
		if err != nil {
			t.Fatal(err)
		}
		inline := datasource.SpecOf(parsed.Dataset)
		pool := t.TempDir()
		_, err = newManager(t, datasource.Config{}).Wait(ctx, datasource.Request{Spec: inline, Pool: pool})
		wantCode(t, err, codes.PermissionDenied)
		m := newManager(t, datasource.Config{NFSServers: []string{exp.Host}})
		if _, err := stage(ctx, t, m, datasource.Request{Spec: inline, Pool: pool}); err != nil {
			t.Fatal(err)
		}
		tree, _ := m.TreePath(pool, inline)
		checkTree(t, tree, want)
	})
}

// TestProofsBounded: a pod author who names many credentials makes the node run at most a few
// full access proofs (listings) at once; the rest wait their turn.
func TestProofsBounded(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	smallTree(30, 3, 100).upload(t, s, "data", "set/")
	var mu sync.Mutex
	inFlight, most := map[string]int{}, 0
	proxy := testpeers.StartProxy(t, s.Endpoint, nil)
	pool := t.TempDir()
	m := newManager(t, datasource.Config{})
	spec := mustSpec(t, s3Params(s, proxy.URL, "s3://data/set"))
	if _, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}); err != nil {
		t.Fatal(err)
	}
	// Listings by other keys are held a while, and counted while they are.
	proxy.SetFaults(func(r *http.Request, _ int64) testpeers.Fault {
		_, cred, _ := strings.Cut(r.Header.Get("Authorization"), "Credential=")
		key, _, _ := strings.Cut(cred, "/")
		if r.URL.Query().Get("list-type") == "" || key == s.AccessKey {
			return testpeers.None
		}
		mu.Lock()
		inFlight[key]++
		most = max(most, len(inFlight))
		mu.Unlock()
		time.Sleep(300 * time.Millisecond)
		mu.Lock()
		if inFlight[key]--; inFlight[key] == 0 {
			delete(inFlight, key)
		}
		mu.Unlock()
		return testpeers.None
	})
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			// Keys the server does not know: each is refused once its listing got through.
			_, err := m.Wait(ctx, datasource.Request{Spec: spec, Pool: pool,
				Creds: datasource.Credentials{AccessKeyID: fmt.Sprintf("tenant-%02d", i), SecretAccessKey: "x"}})
			if err == nil {
				t.Errorf("tenant %d was served the cache", i)
			}
		})
	}
	wg.Wait()
	if most == 0 || most > 4 {
		t.Fatalf("%d full proofs at once, want 1 to 4", most)
	}
}
