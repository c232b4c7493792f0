package datasource_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/pkg/streamfs"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// TestStreamingPinsDataset: a streaming volume is handed its dataset while the staging runs and
// reads it through FUSE;
// once staged, the dataset is the least recently used one on a full pool, and eviction still
// leaves it alone while the volume is served, taking the next one instead. Released, its
// scratch directory goes and the dataset is an eviction candidate like any other.
func TestStreamingPinsDataset(t *testing.T) {
	ctx := testCtx(t)
	pool := loopPool(t, 96<<20)
	var st unix.Statfs_t
	if err := unix.Statfs(pool, &st); err != nil {
		t.Fatal(err)
	}
	// Three datasets and the stream's copy of one cannot fit above the low watermark.
	size := int64(st.Blocks) * st.Bsize / 5
	src := t.TempDir()
	for _, name := range []string{"a", "b", "c"} {
		dataset{"blob.bin": randBytes(uint64(name[0]), int(size)), "small.txt": []byte(name)}.writeDir(t, filepath.Join(src, name))
	}
	// Throttled, so the stream is handed out while b still stages (its listing is taken at once).
	m := newManager(t, datasource.Config{LocalSourceRoots: []string{src}, LowWatermark: 0.30, HighWatermark: 0.50,
		BandwidthBytesPerSec: 16 << 20})
	spec := func(name string) *datasource.Spec {
		return mustSpec(t, map[string]string{"source": "file://" + filepath.Join(src, name)})
	}
	reqB := datasource.Request{Spec: spec("b"), Pool: pool}
	stB, s, err := m.Stream(ctx, reqB, "vol-b")
	if err != nil || s == nil {
		t.Fatalf("stream b: %v %v (a stream: %v)", stB, err, s != nil)
	}
	t.Cleanup(s.Release)
	if stB.Ready() {
		t.Fatalf("b was staged before its stream was handed out: %v", stB)
	}
	if len(s.Objects) != 2 || !exists(s.Scratch) {
		t.Fatalf("stream: %d objects, scratch %s exists %v", len(s.Objects), s.Scratch, exists(s.Scratch))
	}
	// Served through FUSE while b stages: the bytes are the source's, fetched on demand and
	// counted as such.
	mnt, fsm := mountStream(t, s, false)
	for _, key := range []string{"blob.bin", "small.txt"} {
		got, err := os.ReadFile(filepath.Join(mnt, key))
		want, _ := os.ReadFile(filepath.Join(src, "b", key))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s through the stream: %d bytes, err %v; want the source's %d", key, len(got), err, len(want))
		}
	}
	if n := fetched(t, m, "stream"); n == 0 {
		t.Error("no bytes counted as fetched by the stream")
	}
	if err := fsm.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"b", "a", "c"} { // b staged first: the least recently used
		if _, err := stage(ctx, t, m, datasource.Request{Spec: spec(name), Pool: pool}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if _, err := m.TreePath(pool, spec("b")); err != nil {
		t.Fatalf("b, served by a streaming volume, was evicted: %v", err)
	}
	if _, err := m.TreePath(pool, spec("a")); err == nil {
		t.Fatal("a was not evicted: the pool was not full, the test proves nothing")
	}
	// The stream serves the staged file from the cache now.
	for _, o := range s.Objects {
		if o.Key != "blob.bin" {
			continue
		}
		f, err := s.Cached(o)
		if err != nil || f == nil {
			t.Fatalf("blob.bin not served from the cache: %v", err)
		}
		f.Close()
	}
	// A fetch that would take the pool below its low watermark is refused (after evicting what
	// no volume uses), never written.
	if err := s.Room(ctx, int64(st.Blocks)*st.Bsize); datasource.Code(err) != codes.ResourceExhausted {
		t.Errorf("room for the whole pool: %v, want ResourceExhausted", err)
	}
	if _, err := m.TreePath(pool, spec("b")); err != nil {
		t.Fatalf("b evicted to make room for its own stream: %v", err)
	}
	s.Release()
	if exists(s.Scratch) {
		t.Errorf("scratch %s left after release", s.Scratch)
	}
}

// TestStreamingReadJoinsStaging: through FUSE, reads of files the staging has not fetched yet
// join the staging's download rather than fetching them a second time: every object is
// requested from versitygw exactly once (bytes asked for, counted at a proxy), the contents are
// the uploaded ones, and a file last in the staging's order, read first, is fetched before the
// staging ends (it went ahead of the queue).
func TestStreamingReadJoinsStaging(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	want := smallTree(9, 60, 16<<10)
	want["big.bin"] = randBytes(10, 12<<20+333) // read by the staging in 1 MiB ranges
	want.upload(t, s, "data", "")
	// Object bytes asked for, by key: a ranged GET counts its range, a plain one the object.
	var mu sync.Mutex
	asked := map[string]int64{}
	proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		key := strings.TrimPrefix(r.URL.Path, "/data/")
		if data, ok := want[key]; ok && r.Method == http.MethodGet {
			n := int64(len(data))
			var from, to int64
			if _, err := fmt.Sscanf(r.Header.Get("Range"), "bytes=%d-%d", &from, &to); err == nil {
				n = min(to, int64(len(data))-1) - from + 1
			}
			mu.Lock()
			asked[key] += n
			mu.Unlock()
		}
		return testpeers.None
	})
	// Throttled and two at a time: the reads below all come while the staging runs.
	m := newManager(t, datasource.Config{Concurrency: 2, ChunkSize: 1 << 20, BandwidthBytesPerSec: 4 << 20})
	pool := t.TempDir()
	req := datasource.Request{Spec: mustSpec(t, s3Params(s, proxy.URL, "s3://data")), Creds: creds(s), Pool: pool}
	st, ds, err := m.Stream(ctx, req, "vol-join")
	if err != nil || ds == nil {
		t.Fatalf("stream: %v %v (a stream: %v)", st, err, ds != nil)
	}
	t.Cleanup(ds.Release)
	mnt, fsm := mountStream(t, ds, true)
	read := func(key string) {
		t.Helper()
		got, err := os.ReadFile(filepath.Join(mnt, key))
		if err != nil || !bytes.Equal(got, want[key]) {
			t.Fatalf("%s through the stream: %d bytes, err %v; want the uploaded %d", key, len(got), err, len(want[key]))
		}
	}
	// The last small file of the manifest, which the staging would fetch last.
	var last string
	for _, o := range ds.Objects {
		if o.Type != source.Dir && o.Type != source.Symlink && o.Key != "big.bin" {
			last = o.Key
		}
	}
	read(last)
	if st, err := m.Ensure(ctx, req); err != nil || st.Ready() || st.ObjectsDone >= st.ObjectsTotal {
		t.Fatalf("the staging ended before the read of %s returned (%v, %v): nothing shows it went ahead", last, st, err)
	}
	read("big.bin")
	for key := range want {
		read(key)
	}
	if _, err := stage(ctx, t, m, req); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for key, data := range want {
		if asked[key] != int64(len(data)) {
			t.Errorf("%s: %d bytes asked of the server, want %d (one download)", key, asked[key], len(data))
		}
	}
	if n := fetched(t, m, "stream"); n != 0 {
		t.Errorf("the stream fetched %v bytes itself, want 0: every read joined the staging", n)
	}
	// Each open waited for the staging's copy and was passed through to it: no read reached
	// the plugin (FUSE passthrough: kernel 6.9 and later).
	if passthroughKernel() && fsm.Reads() != 0 {
		t.Errorf("%d reads served by the plugin, want 0: the opens were not passed through", fsm.Reads())
	}
}

// passthroughKernel reports whether the kernel offers FUSE passthrough (6.9 and later).
func passthroughKernel() bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var major, minor int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major > 6 || major == 6 && minor >= 9
}

// TestStreamingJoinChangedObject: an object overwritten in S3 after the listing, read through a
// streaming volume before the staging reached it: the read joins the staging, which fails on
// the changed object (pinned to the listed ETag); the read then fetches it itself, pinned too,
// and gets EIO, never the new bytes.
func TestStreamingJoinChangedObject(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	want := dataset{"a-first.bin": randBytes(11, 8<<20), "z-changed.txt": []byte("as listed")}
	want.upload(t, s, "data", "")
	// One at a time and throttled: the staging is still on a-first.bin when z-changed.txt is read.
	m := newManager(t, datasource.Config{Concurrency: 1, BandwidthBytesPerSec: 1 << 20})
	req := datasource.Request{Spec: mustSpec(t, s3Params(s, "", "s3://data")), Creds: creds(s), Pool: t.TempDir()}
	st, ds, err := m.Stream(ctx, req, "vol-changed")
	if err != nil || ds == nil {
		t.Fatalf("stream: %v %v (a stream: %v)", st, err, ds != nil)
	}
	t.Cleanup(ds.Release)
	s.Put(t, "data", "z-changed.txt", []byte("overwritten after the listing"))
	mnt, _ := mountStream(t, ds, true)
	got, err := os.ReadFile(filepath.Join(mnt, "z-changed.txt"))
	if !errors.Is(err, unix.EIO) {
		t.Fatalf("read of an object changed after the listing: %q, err %v; want EIO", got, err)
	}
	if st, err := m.Ensure(ctx, req); err == nil || st.Ready() {
		t.Errorf("the staging did not fail on the changed object: %v, %v", st, err)
	}
}

// mountStream serves a stream through FUSE (joining its staging when join is set) in a
// directory of the test's, unmounted at its end.
func mountStream(t *testing.T, ds *datasource.Streaming, join bool) (string, *streamfs.Mount) {
	t.Helper()
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := streamfs.Config{Objects: ds.Objects, Cached: ds.Cached, Scratch: ds.Scratch,
		Fetcher: streamfs.SourceFetcher{Source: ds.Source}, OnFetch: ds.OnFetch}
	if join {
		cfg.Join = ds.Join
	}
	fsm, err := streamfs.Start(mnt, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fsm.Close(); err != nil {
			_ = unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	return mnt, fsm
}
