package datasource_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/test/testutil"
)

// loopPool formats a small ext4 image, loop-mounts it and returns the mount point.
func loopPool(t *testing.T, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testutil.Unavailable(t, "needs root for loop mounts")
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "pool.img")
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(size)
	f.Close()
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs: %v %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v %s", err, out)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			_ = unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	return mnt
}

// TestEviction fills a small pool: staging a new dataset evicts the least recently used dataset
// no volume uses, never one in use; a dataset that cannot fit even then is refused.
func TestEviction(t *testing.T) {
	ctx := testCtx(t)
	pool := loopPool(t, 96<<20)
	var st unix.Statfs_t
	unix.Statfs(pool, &st)
	total := int64(st.Blocks) * st.Bsize

	src := t.TempDir()
	mb := int64(1 << 20)
	size := total / 4 // four datasets cannot fit
	for _, name := range []string{"a", "b", "c"} {
		dataset{"blob.bin": randBytes(uint64(name[0]), int(size)), "small.txt": []byte(name)}.writeDir(t, filepath.Join(src, name))
	}
	dataset{"huge.bin": randBytes(9, int(total*9/10))}.writeDir(t, filepath.Join(src, "huge"))

	var mu sync.Mutex
	var events []datasource.EvictEvent
	m := newManager(t, datasource.Config{
		LocalSourceRoots: []string{src}, LowWatermark: 0.30, HighWatermark: 0.50,
		OnEvict: func(e datasource.EvictEvent) { mu.Lock(); events = append(events, e); mu.Unlock() },
	})
	spec := func(name string) *datasource.Spec {
		return mustSpec(t, map[string]string{"source": "file://" + filepath.Join(src, name)})
	}
	for _, name := range []string{"a", "b"} {
		if _, err := stage(ctx, t, m, datasource.Request{Spec: spec(name), Pool: pool}); err != nil {
			t.Fatal(err)
		}
	}
	// b is bind-mounted by a volume; a is older and unused.
	if _, err := m.Acquire(pool, spec("b"), "", "vol-b"); err != nil {
		t.Fatal(err)
	}
	if _, err := stage(ctx, t, m, datasource.Request{Spec: spec("c"), Pool: pool}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.TreePath(pool, spec("a")); err == nil {
		t.Fatal("a was not evicted")
	}
	for _, name := range []string{"b", "c"} {
		if _, err := m.TreePath(pool, spec(name)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	mu.Lock()
	if len(events) != 1 || events[0].DatasetID != spec("a").ID() || events[0].Reason == "" || events[0].Bytes < size {
		t.Fatalf("events %+v", events)
	}
	mu.Unlock()
	// The inventory says the same: a gone, b used by its volume, c ready.
	inv := inventory(t, m, pool, 0)
	if findDataset(inv, spec("a").ID()) != nil || inv.Total != 2 || inv.Ready != 2 {
		t.Fatalf("inventory after eviction: %+v", inv)
	}
	if b := findDataset(inv, spec("b").ID()); b == nil || b.References != 1 || b.State != datasource.DatasetReady {
		t.Fatalf("b after eviction: %+v", b)
	}

	// Too big even if c were evicted: refused without evicting anything.
	_, err := stage(ctx, t, m, datasource.Request{Spec: spec("huge"), Pool: pool})
	if datasource.Code(err) != codes.ResourceExhausted {
		t.Fatalf("huge: %v", err)
	}
	for _, name := range []string{"b", "c"} {
		if _, err := m.TreePath(pool, spec(name)); err != nil {
			t.Fatalf("%s evicted for a dataset that could not fit: %v", name, err)
		}
	}
	// Released, b becomes a candidate like any other.
	if err := m.ReleaseID(pool, spec("b").ID(), "vol-b"); err != nil {
		t.Fatal(err)
	}
	_ = mb
}
