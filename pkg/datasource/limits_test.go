package datasource_test

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// delayObjects delays every object GET (not listings) by d.
func delayObjects(d time.Duration) func(*http.Request, int64) testpeers.Fault {
	return func(r *http.Request, _ int64) testpeers.Fault {
		f := testpeers.None
		if r.Method == http.MethodGet && r.URL.Query().Get("list-type") == "" {
			f.Delay = d
		}
		return f
	}
}

// TestLimitsRefuseBeforeReading: a dataset past an administrator's limit is refused from its
// listing, before any object is read, and nothing is left on the pool. Empty files count.
func TestLimitsRefuseBeforeReading(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	for i := range 6 {
		s.Put(t, "data", fmt.Sprintf("many/f%d", i), []byte("x"))
		s.Put(t, "data", fmt.Sprintf("empty/e%02d", i), nil)
	}
	s.Put(t, "data", "deep/a/b/c/d/e.bin", []byte("x"))
	s.Put(t, "data", "long/"+strings.Repeat(strings.Repeat("k", 100)+"/", 3)+"x", []byte("x"))
	s.Put(t, "data", "big/blob", make([]byte, 1<<20))
	proxy := testpeers.StartProxy(t, s.Endpoint, nil)
	for _, tc := range []struct {
		name, prefix string
		limits       datasource.Limits
		capacity     int64
		code         codes.Code
		want         string
	}{
		{"objects", "many", datasource.Limits{MaxObjects: 5}, 0, codes.OutOfRange, "more than 5 entries"},
		{"bytes", "big", datasource.Limits{MaxBytes: 64 << 10}, 0, codes.OutOfRange, "more than 64.0 KiB"},
		{"key depth", "deep", datasource.Limits{MaxKeyDepth: 3}, 0, codes.InvalidArgument, "levels deep"},
		{"key length", "long", datasource.Limits{MaxKeyLength: 256, MaxKeyDepth: 8}, 0, codes.InvalidArgument, "bytes long"},
		{"manifest", "many", datasource.Limits{MaxManifestBytes: 100}, 0, codes.OutOfRange, "manifest is larger"},
		{"empty files take room", "empty", datasource.Limits{}, 16 << 10, codes.OutOfRange, "more than the 16.0 KiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := t.TempDir()
			before := proxy.Requests.Load()
			gets := 0
			proxy.SetFaults(func(r *http.Request, _ int64) testpeers.Fault {
				if r.Method == http.MethodGet && r.URL.Query().Get("list-type") == "" {
					gets++
				}
				return testpeers.None
			})
			m := newManager(t, datasource.Config{Limits: tc.limits})
			spec := mustSpec(t, s3Params(s, proxy.URL, "s3://data/"+tc.prefix))
			_, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool, Capacity: tc.capacity})
			if datasource.Code(err) != tc.code || !strings.Contains(fmt.Sprint(err), tc.want) {
				t.Fatalf("got %v, want %v naming %q", err, tc.code, tc.want)
			}
			if gets != 0 {
				t.Errorf("%d objects read before the refusal (%d requests)", gets, proxy.Requests.Load()-before)
			}
			if ents, _ := os.ReadDir(filepath.Join(pool, datasource.CacheDirName)); len(ents) != 0 {
				t.Errorf("left behind: %v", ents)
			}
		})
	}
}

// TestSlowReadsAndDeadline: a read slower than the minimum throughput is cancelled and retried,
// and fails the attempt once retries are spent; a staging past its deadline ends. Neither would
// end without the limits (the server answers, only slowly).
func TestSlowReadsAndDeadline(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	smallTree(20, 4, 1000).upload(t, s, "data", "set/")
	proxy := testpeers.StartProxy(t, s.Endpoint, delayObjects(3*time.Second))
	spec := mustSpec(t, s3Params(s, proxy.URL, "s3://data/set"))
	for _, tc := range []struct {
		name   string
		limits datasource.Limits
		want   string
	}{
		{"minimum throughput", datasource.Limits{ReadGrace: 200 * time.Millisecond, MinThroughput: 1 << 30}, "slower than the minimum throughput"},
		{"deadline", datasource.Limits{JobDeadline: time.Second}, "staging took longer than 1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newManager(t, datasource.Config{Limits: tc.limits, Retries: 2})
			_, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: t.TempDir()})
			if datasource.Code(err) != codes.Unavailable || !strings.Contains(fmt.Sprint(err), tc.want) {
				t.Fatalf("got %v, want Unavailable naming %q", err, tc.want)
			}
		})
	}
}

// TestAbandonedStagingCancelled: a staging nobody asks for any more is cancelled and its partial
// data deleted. It is shown to have staged first: the server answers the first object and holds
// the second, so the staging has that object's bytes on the pool and a read in flight when it is
// abandoned; that read is then given up by the client, and the staging and its bytes are gone.
func TestAbandonedStagingCancelled(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	tree := smallTree(21, 8, 1000)
	tree.upload(t, s, "data", "set/")
	var (
		mu              sync.Mutex
		answered        []string // the object GETs let through
		held, cancelled = make(chan struct{}), make(chan struct{})
	)
	proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method != http.MethodGet || r.URL.Query().Get("list-type") != "" {
			return testpeers.None
		}
		mu.Lock()
		if len(answered) == 0 {
			answered = append(answered, r.URL.Path)
			mu.Unlock()
			return testpeers.None
		}
		mu.Unlock()
		select {
		case held <- struct{}{}: // the second object's GET: held until the client goes
			<-r.Context().Done()
			close(cancelled)
		case <-r.Context().Done():
		}
		return testpeers.Fault{Status: http.StatusServiceUnavailable, Code: "SlowDown"}
	})
	spec := mustSpec(t, s3Params(s, proxy.URL, "s3://data/set"))
	pool := t.TempDir()
	m := newManager(t, datasource.Config{Concurrency: 1, Limits: datasource.Limits{AbandonAfter: 400 * time.Millisecond}})
	if _, err := m.Ensure(ctx, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(pool, datasource.CacheDirName, spec.ID())
	select {
	case <-held:
	case <-time.After(time.Minute):
		t.Fatal("the staging never read a second object")
	}
	// Staging, with the first object's bytes on the pool.
	st, known, err := m.Status(pool, spec)
	if err != nil || !known || st.Ready() || st.ObjectsTotal != int64(len(tree)) || st.ObjectsDone < 1 {
		t.Fatalf("staging with the first object read: status %+v, known %v, err %v", st, known, err)
	}
	mu.Lock()
	first := strings.TrimPrefix(answered[0], "/data/set/")
	mu.Unlock()
	if staged := stagedCopies(t, dir, tree[first]); staged == 0 {
		t.Fatalf("%s read, but no copy of its %d bytes under %s", first, len(tree[first]), dir)
	}

	select {
	case <-cancelled:
	case <-time.After(time.Minute):
		t.Fatal("the read in flight was never given up")
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, known, _ := m.Status(pool, spec)
		return !known && !exists(dir), nil
	}); err != nil {
		_, known, _ := m.Status(pool, spec)
		t.Fatalf("abandoned staging still there (running %v, dir %v): %v", known, exists(dir), err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(answered) != 1 {
		t.Errorf("object GETs answered: %v, want the first only", answered)
	}
}

// stagedCopies counts the regular files under dir holding exactly want.
func stagedCopies(t *testing.T, dir string, want []byte) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Equal(b, want) {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSlowSourceLeavesSlots: one slow server holds at most its share of the node's staging
// slots; a dataset from another server stages meanwhile.
func TestSlowSourceLeavesSlots(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	smallTree(22, 6, 1000).upload(t, s, "data", "slow/")
	smallTree(23, 4, 1000).upload(t, s, "data", "fast/")
	slow := testpeers.StartProxy(t, s.Endpoint, delayObjects(4*time.Second))
	fast := testpeers.StartProxy(t, s.Endpoint, nil)
	pool := t.TempDir()
	m := newManager(t, datasource.Config{Concurrency: 2})
	slowSpec := mustSpec(t, s3Params(s, slow.URL, "s3://data/slow"))
	if _, err := m.Ensure(ctx, datasource.Request{Spec: slowSpec, Creds: creds(s), Pool: pool}); err != nil {
		t.Fatal(err)
	}
	if _, err := stage(ctx, t, m, datasource.Request{Spec: mustSpec(t, s3Params(s, fast.URL, "s3://data/fast")), Creds: creds(s), Pool: pool}); err != nil {
		t.Fatal(err)
	}
	if st, known, _ := m.Status(pool, slowSpec); !known || st.Ready() {
		t.Fatalf("the slow dataset is %+v (known %v): the fast one waited for it", st, known)
	}
}

// TestStagingKeepsLowWatermark: a dataset that fits the pool only by taking it below its low
// watermark is refused (ResourceExhausted); the pool's volumes keep their room.
func TestStagingKeepsLowWatermark(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("needs root to mount a tmpfs pool") // as the driver's suites do
	}
	ctx := testCtx(t)
	pool := t.TempDir()
	if err := unix.Mount("tmpfs", pool, "tmpfs", 0, "size=16m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(pool, unix.MNT_DETACH) })
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	s.Put(t, "data", "set/a", make([]byte, 15<<20)) // fits 16 MiB, not with 10% kept free
	m := newManager(t, datasource.Config{})
	_, err := stage(ctx, t, m, datasource.Request{Spec: mustSpec(t, s3Params(s, "", "s3://data/set")), Creds: creds(s), Pool: pool})
	if datasource.Code(err) != codes.ResourceExhausted || !strings.Contains(fmt.Sprint(err), "must stay free") {
		t.Fatalf("got %v, want ResourceExhausted", err)
	}
}
