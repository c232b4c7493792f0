package datasource_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// TestStageS3 stages small nested objects, a multipart object and a large single-part object
// from a real S3 server, then serves the second volume from the cache.
func TestStageS3(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	want := smallTree(1, 60, 3000)
	want.upload(t, s, "data", "set/")
	// Multipart, 5 MiB parts: read in part-aligned ranges, each part's MD5 checked.
	big := randBytes(99, 12<<20+12345)
	s.PutMultipart(t, "data", "set/big/multipart.bin", int64(len(big)), 5<<20, func(i int, buf []byte) {
		copy(buf, big[i*(5<<20):])
	})
	want["big/multipart.bin"] = big
	// Single PUT, larger than two chunks: ranged reads, then a full MD5 pass.
	single := randBytes(98, 7<<20+1)
	s.Put(t, "data", "set/big/single.bin", single)
	want["big/single.bin"] = single
	// Outside the prefix and excluded: never staged.
	s.Put(t, "data", "other/x.bin", []byte("x"))
	s.Put(t, "data", "set/skip/me.tmp", []byte("x"))

	// Without S3 checksums, objects are verified by MD5: whole for single-part objects, per part
	// for multipart ones. (TestStageS3Faults covers objects with checksums.)
	proxy := testpeers.StartProxy(t, s.Endpoint, func(*http.Request, int64) testpeers.Fault {
		return testpeers.Fault{ResetAfter: -1, StripChecksums: true}
	})
	pool := t.TempDir()
	m := newManager(t, datasource.Config{Concurrency: 4, ChunkSize: 2 << 20, AccessProofTTL: time.Minute})
	params := s3Params(s, proxy.URL, "s3://data/set")
	params["exclude"] = "*.tmp"
	spec := mustSpec(t, params)
	req := datasource.Request{Spec: spec, Creds: creds(s), Pool: pool, Capacity: 1 << 30}

	st, err := stage(ctx, t, m, req)
	if err != nil {
		t.Fatal(err)
	}
	if st.CacheHit {
		t.Fatal("first staging reported a cache hit")
	}
	tree, err := m.TreePath(pool, spec)
	if err != nil {
		t.Fatal(err)
	}
	checkTree(t, tree, want)

	// Second volume of the same dataset: a cache hit, no object read again.
	gets := proxy.Requests.Load()
	st, err = m.Ensure(ctx, req)
	if err != nil || !st.Ready() || !st.CacheHit {
		t.Fatalf("second Ensure: %v %v", st, err)
	}
	if st.BytesTotal != int64(len(big)+len(single))+sumSizes(smallTree(1, 60, 3000)) {
		t.Fatalf("bytes total %d", st.BytesTotal)
	}
	if n := proxy.Requests.Load() - gets; n != 1 {
		t.Fatalf("cache hit made %d requests, want one pinned read (the stager's proof is remembered)", n)
	}
	// A caller without a remembered proof lists the dataset and reads one file.
	gets = proxy.Requests.Load()
	if st, err := newManager(t, datasource.Config{}).Ensure(ctx, req); err != nil || !st.CacheHit {
		t.Fatalf("cache hit of a restarted node plugin: %v %v", st, err)
	}
	if n := proxy.Requests.Load() - gets; n < 2 {
		t.Fatalf("a full proof made %d requests", n)
	}

	// A writable volume gets its own copy, once.
	vol := t.TempDir()
	if err := m.Populate(ctx, pool, spec, "", vol); err != nil {
		t.Fatal(err)
	}
	checkTree(t, vol, want)
	os.WriteFile(filepath.Join(vol, "user-file"), []byte("mine"), 0o644)
	if err := m.Populate(ctx, pool, spec, "", vol); err != nil {
		t.Fatal(err)
	}
	if !exists(filepath.Join(vol, "user-file")) {
		t.Fatal("second Populate touched a populated volume")
	}

	// Metrics are exported.
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"cistern_dataset_stagings_total", "cistern_dataset_cache_hits_total", "cistern_dataset_cache_bytes"} {
		if !names[n] {
			t.Errorf("metric %s missing", n)
		}
	}
}

func sumSizes(d dataset) int64 {
	var n int64
	for _, v := range d {
		n += int64(len(v))
	}
	return n
}

// TestStageS3Faults stages through a proxy that throttles, fails, resets and stalls.
func TestStageS3Faults(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	want := smallTree(2, 40, 200<<10)
	want.upload(t, s, "data", "")
	big := randBytes(7, 9<<20)
	s.Put(t, "data", "big.bin", big)
	want["big.bin"] = big

	var seen keyCounter
	proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, n int64) testpeers.Fault {
		if r.Method != http.MethodGet {
			return testpeers.None
		}
		if r.URL.Query().Has("list-type") {
			if seen.first("list") {
				return testpeers.Fault{Status: 500, Code: "InternalError"}
			}
			return testpeers.None
		}
		key := r.URL.Path + r.Header.Get("Range")
		switch seen.count(key) {
		case 1:
			switch n % 4 {
			case 0:
				return testpeers.Fault{Status: 503, Code: "SlowDown"}
			case 1:
				return testpeers.Fault{ResetAfter: 1000}
			case 2:
				return testpeers.Fault{ResetAfter: 100, Stall: 3 * time.Second}
			default:
				return testpeers.Fault{Delay: 200 * time.Millisecond, ResetAfter: -1}
			}
		}
		return testpeers.None
	})
	pool := t.TempDir()
	m := newManager(t, datasource.Config{Concurrency: 8, ChunkSize: 2 << 20})
	spec := mustSpec(t, s3Params(s, proxy.URL, "s3://data"))
	if _, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}); err != nil {
		t.Fatal(err)
	}
	tree, _ := m.TreePath(pool, spec)
	checkTree(t, tree, want)
}

// TestStageS3DetectsCorruption: bytes damaged on the way are caught by the objects' own
// checksums (computed by the engine as they stream, or per range and combined), fetched again
// when the damage is transient, and never published when it persists.
func TestStageS3DetectsCorruption(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	want := smallTree(4, 20, 10<<10)
	want.upload(t, s, "data", "")
	big := randBytes(5, 9<<20+7) // read in ranges whose CRCs combine
	s.Put(t, "data", "big.bin", big)
	want["big.bin"] = big
	head, err := s.Client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("data"), Key: aws.String("big.bin"),
		ChecksumMode: types.ChecksumModeEnabled})
	if err != nil {
		t.Fatal(err)
	}
	if head.ChecksumCRC32 == nil && head.ChecksumCRC32C == nil && head.ChecksumCRC64NVME == nil {
		t.Fatal("the server keeps no CRC for objects: nothing to test")
	}

	var seen keyCounter
	proxy := testpeers.StartProxy(t, s.Endpoint, nil)
	spec := mustSpec(t, s3Params(s, proxy.URL, "s3://data"))

	t.Run("failure case - every read damaged", func(t *testing.T) {
		proxy.SetFaults(func(r *http.Request, _ int64) testpeers.Fault {
			if r.Method == http.MethodGet && !r.URL.Query().Has("list-type") {
				return testpeers.Fault{ResetAfter: -1, Flip: true}
			}
			return testpeers.None
		})
		pool := t.TempDir()
		m := newManager(t, datasource.Config{Concurrency: 4, ChunkSize: 2 << 20, Retries: 2})
		_, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool})
		if datasource.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "does not match") {
			t.Fatalf("got %v (%v), want a checksum mismatch", datasource.Code(err), err)
		}
		if _, err := m.TreePath(pool, spec); err == nil {
			t.Fatal("a damaged dataset was published")
		}
	})
	t.Run("damage on first reads only", func(t *testing.T) {
		proxy.SetFaults(func(r *http.Request, _ int64) testpeers.Fault {
			if r.Method == http.MethodGet && !r.URL.Query().Has("list-type") && seen.count(r.URL.Path+r.Header.Get("Range")) == 1 {
				return testpeers.Fault{ResetAfter: -1, Flip: true}
			}
			return testpeers.None
		})
		pool := t.TempDir()
		m := newManager(t, datasource.Config{Concurrency: 4, ChunkSize: 2 << 20})
		req := datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}
		// A damaged whole object is fetched again at once; a damaged range shows when the
		// object's CRCs are combined, and fails the attempt: the next attempt keeps every
		// verified file and reads that object again.
		_, err := stage(ctx, t, m, req)
		if err != nil {
			if !strings.Contains(err.Error(), "does not match") {
				t.Fatal(err)
			}
			if _, err = stage(ctx, t, m, req); err != nil {
				t.Fatal(err)
			}
		}
		tree, err := m.TreePath(pool, spec)
		if err != nil {
			t.Fatal(err)
		}
		checkTree(t, tree, want)
	})
}

// TestStageS3DirectWrites stages large objects read whole, written with direct I/O (2 MiB and
// more): a read cut off mid-block resumes on a block boundary, and the last block's padding is
// cut off.
func TestStageS3DirectWrites(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	want := dataset{"unaligned.bin": randBytes(21, 8<<20+4097), "aligned.bin": randBytes(22, 12<<20),
		"small-unaligned.bin": randBytes(23, 3<<20+4097), "small-aligned.bin": randBytes(24, 4<<20)}
	want.upload(t, s, "data", "")
	var seen keyCounter
	proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method == http.MethodGet && !r.URL.Query().Has("list-type") && seen.count(r.URL.Path) == 1 {
			return testpeers.Fault{ResetAfter: 3<<20 + 17}
		}
		return testpeers.None
	})
	pool := t.TempDir()
	m := newManager(t, datasource.Config{Concurrency: 2, ChunkSize: 16 << 20})
	spec := mustSpec(t, s3Params(s, proxy.URL, "s3://data"))
	if _, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}); err != nil {
		t.Fatal(err)
	}
	tree, _ := m.TreePath(pool, spec)
	checkTree(t, tree, want)
}

// TestStageS3PermanentErrors fails fast with a clear cause and leaves nothing behind.
func TestStageS3PermanentErrors(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	s.Put(t, "data", "a.bin", []byte("hello"))
	for _, tc := range []struct {
		name     string
		params   map[string]string
		creds    datasource.Credentials
		wantCode codes.Code
		wantMsg  string
	}{
		{"failure case - wrong secret", s3Params(s, "", "s3://data"), datasource.Credentials{AccessKeyID: s.AccessKey, SecretAccessKey: "wrong"}, codes.PermissionDenied, "access denied"},
		{"failure case - anonymous on a private bucket", s3Params(s, "", "s3://data"), datasource.Credentials{}, codes.PermissionDenied, "access denied"},
		{"failure case - no such bucket", s3Params(s, "", "s3://nope"), creds(s), codes.FailedPrecondition, "not found"},
		{"failure case - unknown host", s3Params(s, "https://no-such-host.invalid:9000", "s3://data"), creds(s), codes.InvalidArgument, "bad endpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := t.TempDir()
			m := newManager(t, datasource.Config{})
			spec := mustSpec(t, tc.params)
			_, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: tc.creds, Pool: pool})
			if datasource.Code(err) != tc.wantCode || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("got %v (%v), want %v containing %q", datasource.Code(err), err, tc.wantCode, tc.wantMsg)
			}
			if !strings.Contains(err.Error(), spec.Source) {
				t.Fatalf("error %q does not name the dataset", err)
			}
			if strings.Contains(err.Error(), s.SecretKey) {
				t.Fatal("error leaks the secret")
			}
			if ents, _ := os.ReadDir(filepath.Join(pool, datasource.CacheDirName)); len(ents) != 0 {
				t.Fatalf("left behind: %v", ents)
			}
		})
	}
}

// TestCacheHitChecksAccess: a dataset cached with one tenant's credentials is not served to a
// caller whose credentials cannot read it.
func TestCacheHitChecksAccess(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	s.Put(t, "data", "a.bin", []byte("hello"))
	pool := t.TempDir()
	m := newManager(t, datasource.Config{})
	spec := mustSpec(t, s3Params(s, "", "s3://data"))
	if _, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}); err != nil {
		t.Fatal(err)
	}
	_, err := m.Ensure(ctx, datasource.Request{Spec: spec, Pool: pool})
	if datasource.Code(err) != codes.PermissionDenied {
		t.Fatalf("anonymous cache hit: %v", err)
	}
}

// TestTooLarge refuses a dataset bigger than the volume before reading any object.
func TestTooLarge(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	smallTree(3, 10, 100<<10).upload(t, s, "data", "")
	proxy := testpeers.StartProxy(t, s.Endpoint, nil)
	pool := t.TempDir()
	m := newManager(t, datasource.Config{})
	spec := mustSpec(t, s3Params(s, proxy.URL, "s3://data"))
	_, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool, Capacity: 512 << 10})
	if datasource.Code(err) != codes.OutOfRange {
		t.Fatalf("got %v", err)
	}
	for _, k := range []string{"/data/d00/e0/f00000.bin"} {
		if n := proxy.Gets(k); n != 0 {
			t.Fatalf("%s read %d times", k, n)
		}
	}
}

// TestObjectChangedDuringStaging: reads are pinned to the listed ETag.
func TestObjectChangedDuringStaging(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	s.Put(t, "data", "a.bin", []byte("version one"))
	var overwritten atomic.Bool
	proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method == http.MethodGet && r.URL.Path == "/data/a.bin" && overwritten.CompareAndSwap(false, true) {
			s.Put(t, "data", "a.bin", []byte("version two!"))
		}
		return testpeers.None
	})
	pool := t.TempDir()
	m := newManager(t, datasource.Config{})
	spec := mustSpec(t, s3Params(s, proxy.URL, "s3://data"))
	_, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool})
	if datasource.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "changed") {
		t.Fatalf("got %v", err)
	}
	// The next attempt takes a new manifest and gets version two.
	if _, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}); err != nil {
		t.Fatal(err)
	}
	tree, _ := m.TreePath(pool, spec)
	checkTree(t, tree, dataset{"a.bin": []byte("version two!")})
}

// TestHostileKeys: a server listing keys that would escape the volume is refused, and nothing is
// written outside the cache.
func TestHostileKeys(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	s.Put(t, "data", "ok.bin", []byte("fine"))
	for _, key := range []string{"../escape.bin", "a/../../escape.bin", "a/../../../../tmp/escape.bin", "/abs.bin", "a//b.bin", "./x.bin"} {
		t.Run(key, func(t *testing.T) {
			listing := `<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>data</Name><Prefix></Prefix>` +
				`<KeyCount>2</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>` +
				`<Contents><Key>ok.bin</Key><Size>4</Size><ETag>"x"</ETag></Contents>` +
				`<Contents><Key>` + key + `</Key><Size>4</Size><ETag>"y"</ETag></Contents></ListBucketResult>`
			proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
				if r.URL.Query().Has("list-type") {
					return testpeers.Fault{Body: listing, ResetAfter: -1}
				}
				return testpeers.None
			})
			base := t.TempDir()
			pool := filepath.Join(base, "pool")
			os.Mkdir(pool, 0o755)
			m := newManager(t, datasource.Config{})
			spec := mustSpec(t, s3Params(s, proxy.URL, "s3://data"))
			_, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool})
			if datasource.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), key) {
				t.Fatalf("got %v", err)
			}
			if n := proxy.Gets("/data/ok.bin"); n != 0 {
				t.Fatalf("objects were read (%d) before the listing was validated", n)
			}
			ents, _ := os.ReadDir(base)
			if len(ents) != 1 || exists("/tmp/escape.bin") {
				t.Fatalf("something escaped: %v", ents)
			}
		})
	}
}

// keyCounter counts requests per key; the proxy calls it from the server's goroutines.
type keyCounter struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *keyCounter) count(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int{}
	}
	c.m[k]++
	return c.m[k]
}

func (c *keyCounter) first(k string) bool { return c.count(k) == 1 }
