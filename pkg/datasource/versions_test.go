package datasource_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// Two tenants whose listings of one source differ (issue 24, item 7): an S3 endpoint that
// resolves the bucket per credential, as a gateway over tenant namespaces does. Tenant A signs
// with its keys and reaches one versitygw; tenant B is anonymous and reaches another, whose
// bucket policy lets anyone list and read the prefix. Both name s3://shared/set at the same
// endpoint: one dataset ID, two versions. Before versions were kept side by side, each tenant's
// cache hit found the other's version, staged its own over it, and so on for ever.

const alternations = 6

// perCredentialEndpoint routes signed requests to a and anonymous ones to b, and counts the
// object reads that fetch data (not the one-byte pinned reads of a remembered proof).
type perCredentialEndpoint struct {
	a, b           *httputil.ReverseProxy
	getsA, getsB   atomic.Int64
	probeA, probeB atomic.Int64
	lists, heads   atomic.Int64
}

func startPerCredentialEndpoint(t *testing.T, a, b *testpeers.S3) (*perCredentialEndpoint, string) {
	proxy := func(endpoint string) *httputil.ReverseProxy {
		u, err := url.Parse(endpoint)
		if err != nil {
			t.Fatal(err)
		}
		return &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(u)
			r.Out.Host = r.In.Host // the signature covers the Host header
		}}
	}
	e := &perCredentialEndpoint{a: proxy(a.Endpoint), b: proxy(b.Endpoint)}
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return e, srv.URL
}

func (e *perCredentialEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	signed := r.Header.Get("Authorization") != "" || r.URL.Query().Get("X-Amz-Credential") != ""
	objectGet := r.Method == http.MethodGet && !r.URL.Query().Has("list-type") && strings.Count(strings.Trim(r.URL.Path, "/"), "/") >= 1
	probe := r.Header.Get("Range") == "bytes=0-0"
	switch {
	case r.Method == http.MethodGet && r.URL.Query().Has("list-type"):
		e.lists.Add(1)
	case r.Method == http.MethodHead:
		e.heads.Add(1)
	}
	switch {
	case signed && objectGet && probe:
		e.probeA.Add(1)
	case signed && objectGet:
		e.getsA.Add(1)
	case objectGet && probe:
		e.probeB.Add(1)
	case objectGet:
		e.getsB.Add(1)
	}
	if signed {
		e.a.ServeHTTP(w, r)
		return
	}
	e.b.ServeHTTP(w, r)
}

// TestTenantsWithDifferentListingsKeepTheirVersions: A and B alternate, each staging its own
// version once; afterwards every request of either is a cache hit of its own version (no object
// read, no staging), never the other's, and A's first volume keeps its tree throughout. With a
// remembered proof (TTL) a hit reads one byte; without (TTL 0) it lists and checks every file.
func TestTenantsWithDifferentListingsKeepTheirVersions(t *testing.T) {
	for _, ttl := range []time.Duration{time.Minute, 0} {
		t.Run(fmt.Sprintf("ttl=%v", ttl), func(t *testing.T) { alternateTenants(t, ttl) })
	}
}

func alternateTenants(t *testing.T, ttl time.Duration) {
	ctx := testCtx(t)
	sa, sb := testpeers.StartS3(t, ""), testpeers.StartS3(t, "")
	wantA := smallTree(41, 12, 2000)
	wantB := dataset{}
	for k, v := range wantA {
		wantB[k] = v
	}
	for k := range wantA {
		wantB[k] = randBytes(99, 1500) // one file differs
		break
	}
	wantB["extra/only-b.bin"] = randBytes(98, 700)
	sa.Bucket(t, "shared")
	sb.Bucket(t, "shared")
	wantA.upload(t, sa, "shared", "set/")
	wantB.upload(t, sb, "shared", "set/")
	bucketPolicy(t, sb, "shared", anonymousList("shared"), anonymousRead("shared", "set/*"))
	e, endpoint := startPerCredentialEndpoint(t, sa, sb)

	m := newManager(t, datasource.Config{AccessProofTTL: ttl})
	pool := t.TempDir()
	spec := mustSpec(t, s3Params(sa, endpoint, "s3://shared/set"))
	tenants := []struct {
		name    string
		req     datasource.Request
		want    dataset
		gets    *atomic.Int64
		version string
	}{
		{name: "A", req: datasource.Request{Spec: spec, Creds: creds(sa), Pool: pool}, want: wantA, gets: &e.getsA},
		{name: "B", req: datasource.Request{Spec: spec, Pool: pool}, want: wantB, gets: &e.getsB},
	}
	const firstA = "vol-A-0" // A's first volume, in use for the whole test
	var afterFirst [2]int64
	var listsAfterFirst, headsAfterFirst int64
	stagings := 0
	for round := range alternations {
		for i := range tenants {
			tn := &tenants[i]
			st, err := stage(ctx, t, m, tn.req)
			if err != nil {
				t.Fatalf("round %d, tenant %s: %v", round+1, tn.name, err)
			}
			if !st.CacheHit {
				stagings++
			}
			switch {
			case round == 0:
				tn.version = st.Version
				afterFirst[i] = tn.gets.Load()
			case st.Version != tn.version:
				t.Fatalf("round %d: tenant %s was served version %s, not its own %s", round+1, tn.name, st.Version, tn.version)
			case !st.CacheHit:
				t.Errorf("round %d: tenant %s's own version was staged again", round+1, tn.name)
			}
			if round == 0 && i == 1 {
				listsAfterFirst, headsAfterFirst = e.lists.Load(), e.heads.Load()
			}
			vol := fmt.Sprintf("vol-%s-%d", tn.name, round)
			tree, err := m.Acquire(pool, spec, st.Version, vol)
			if err != nil {
				t.Fatalf("round %d, tenant %s: %v", round+1, tn.name, err)
			}
			checkTree(t, tree, tn.want)
			if vol == firstA {
				continue
			}
			if err := m.ReleaseID(pool, spec.ID(), vol); err != nil {
				t.Fatal(err)
			}
		}
	}
	if tenants[0].version == tenants[1].version {
		t.Fatalf("both tenants were served version %s", tenants[0].version)
	}
	// Where a publication of A's first volume finds its tree now (the version moved aside).
	tree, err := m.Referenced(pool, spec.ID(), firstA)
	if err != nil {
		t.Fatal(err)
	}
	checkTree(t, tree, wantA)
	t.Logf("%d alternations: %d stagings; object GETs A %d (after its first staging %d), B %d (after %d); pinned one-byte reads A %d, B %d; after both first stagings, %d list requests and %d HEADs for %d hits",
		alternations, stagings, e.getsA.Load(), afterFirst[0], e.getsB.Load(), afterFirst[1], e.probeA.Load(), e.probeB.Load(),
		e.lists.Load()-listsAfterFirst, e.heads.Load()-headsAfterFirst, 2*(alternations-1))
	if stagings != 2 {
		t.Errorf("%d stagings in %d alternations of two tenants, want 2 (one each)", stagings, alternations)
	}
	for i, tn := range tenants {
		if n := tn.gets.Load() - afterFirst[i]; n != 0 {
			t.Errorf("tenant %s: %d object GETs after its first staging, want 0", tn.name, n)
		}
	}
}

// TestVersionsBounded: a source that changes five times leaves at most --max-dataset-versions
// (here 2) ready versions of it on the pool; the least recently used unused one goes first, and
// a version a volume uses is never deleted: past the limit it is retired (no caller is served it)
// and goes with its last reference. The inventory shows one dataset, all its versions' bytes.
func TestVersionsBounded(t *testing.T) {
	ctx := testCtx(t)
	src := t.TempDir()
	m := newManager(t, datasource.Config{LocalSourceRoots: []string{src}, Limits: datasource.Limits{MaxVersions: 2}})
	pool := t.TempDir()
	spec := mustSpec(t, map[string]string{"source": "file://" + filepath.Join(src, "set")})
	req := datasource.Request{Spec: spec, Pool: pool}
	edition := func(i int) dataset {
		return dataset{"a.txt": []byte(fmt.Sprintf("edition %d", i)), "b/c.txt": randBytes(uint64(i), 100+i)}
	}
	versions := func() (kept, retired []string) {
		kept, _ = filepath.Glob(filepath.Join(pool, datasource.CacheDirName, spec.ID()+".version-*"))
		retired, _ = filepath.Glob(filepath.Join(pool, datasource.CacheDirName, spec.ID()+".retired-*"))
		return kept, retired
	}
	for i := range 5 {
		edition(i).writeDir(t, filepath.Join(src, "set"))
		st, err := stage(ctx, t, m, req)
		if err != nil || st.CacheHit {
			t.Fatalf("edition %d: %+v %v, want a staging", i, st, err)
		}
		if _, err := m.Acquire(pool, spec, st.Version, fmt.Sprintf("vol-%d", i)); err != nil {
			t.Fatal(err)
		}
		if i != 0 { // vol-0 stays in use throughout
			if err := m.ReleaseID(pool, spec.ID(), fmt.Sprintf("vol-%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		if kept, _ := versions(); len(kept) > 1 {
			t.Fatalf("edition %d: %d kept versions besides the current one, want at most 1: %v", i, len(kept), kept)
		}
	}
	_, retired := versions()
	if len(retired) != 1 {
		t.Fatalf("retired versions %v, want vol-0's", retired)
	}
	tree, err := m.Referenced(pool, spec.ID(), "vol-0")
	if err != nil || tree != filepath.Join(retired[0], "tree") {
		t.Fatalf("vol-0's tree %s %v", tree, err)
	}
	checkTree(t, tree, edition(0))
	inv, err := m.Inventory(pool, 0)
	if err != nil || inv.Total != 1 || inv.Datasets[0].References != 1 {
		t.Fatalf("inventory %+v %v, want one dataset with one reference", inv, err)
	}
	if err := m.ReleaseID(pool, spec.ID(), "vol-0"); err != nil {
		t.Fatal(err)
	}
	if exists(retired[0]) {
		t.Fatal("the retired version outlived its last reference")
	}
}
