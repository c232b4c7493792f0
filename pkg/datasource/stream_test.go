package datasource_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/streamfs"
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
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	fsm, err := streamfs.Start(mnt, streamfs.Config{Objects: s.Objects, Cached: s.Cached, Scratch: s.Scratch,
		Fetcher: streamfs.SourceFetcher{Source: s.Source}, OnFetch: s.OnFetch})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fsm.Close(); err != nil {
			_ = unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
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
