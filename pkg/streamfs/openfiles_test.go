package streamfs_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/pkg/streamfs"
)

// memFetcher serves objects from memory in parts of partN bytes, each with its CRC32C.
type memFetcher struct {
	data  map[string][]byte
	partN int64
}

func (m memFetcher) Layout(_ context.Context, obj source.Object) (streamfs.Layout, error) {
	data := m.data[obj.Key]
	var parts []source.Part
	for off := int64(0); off < int64(len(data)); off += m.partN {
		n := min(m.partN, int64(len(data))-off)
		c := crc32.Checksum(data[off:off+n], crc32.MakeTable(crc32.Castagnoli))
		parts = append(parts, source.Part{Off: off, N: n, Checksum: source.Checksum{Algorithm: "CRC32C",
			Value: base64.StdEncoding.EncodeToString([]byte{byte(c >> 24), byte(c >> 16), byte(c >> 8), byte(c)})}})
	}
	return streamfs.Layout{Parts: parts}, nil
}

func (m memFetcher) Open(_ context.Context, obj source.Object, off, n int64) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(m.data[obj.Key][off : off+n])), nil
}

// fdCount is what the process's descriptors point at: files under the given directories, the
// pipes (go-fuse keeps a pool of splice pipes shared by its servers, grown with the requests it
// answers at once, which is its to bound, not the mount's), and everything else.
type fdCount struct{ under, pipes, other int }

func (c fdCount) notPipes() int { return c.under + c.other }

func openFDs(t *testing.T, dirs ...string) fdCount {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var c fdCount
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil {
			continue // closed since the listing (the ReadDir's own among them)
		}
		switch {
		case strings.HasPrefix(target, "pipe:"):
			c.pipes++
		case underAny(target, dirs):
			c.under++
		default:
			c.other++
		}
	}
	return c
}

func underAny(path string, dirs []string) bool {
	for _, d := range dirs {
		if path == d || strings.HasPrefix(path, d+"/") {
			return true
		}
	}
	return false
}

// TestOpenFilesBound reads 200 files (half in the cache, half fetched on demand, in parts) from
// a mount bounded to 8 descriptors, from 8 readers at once, each file by several readers in
// turn: every byte must be the file's own (a descriptor closed by the bound and its number
// reused must never serve another file's bytes), and the process's descriptors stay within the
// bound plus the readers' own and a few of the mount's.
func TestOpenFilesBound(t *testing.T) {
	requireFUSE(t)
	// Passed through, the cache's copies are read by the kernel; served, every read is Read's.
	t.Run("passthrough", func(t *testing.T) { readThroughBound(t, false) })
	t.Run("every read served", func(t *testing.T) { readThroughBound(t, true) })
}

func readThroughBound(t *testing.T, served bool) {
	const files, bound, readers = 200, 8, 8
	data := map[string][]byte{}
	var objs []source.Object
	cached := t.TempDir()
	for i := range files {
		key := fmt.Sprintf("f%03d.bin", i)
		data[key] = randomBytes(uint64(i), 256<<10+int64(i))
		objs = append(objs, source.Object{Key: key, Type: source.File, Size: int64(len(data[key]))})
		if i%2 == 0 {
			if err := os.WriteFile(filepath.Join(cached, key), data[key], 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	scratch := t.TempDir()
	base := openFDs(t, cached, scratch)
	limit := streamfs.NewOpenFiles(bound)
	m, err := streamfs.Start(dir, streamfs.Config{Objects: objs, Scratch: scratch, Files: limit,
		Fetcher: memFetcher{data: data, partN: 64 << 10},
		Cached: func(o source.Object) (*os.File, error) {
			file, err := os.Open(filepath.Join(cached, o.Key))
			if errors.Is(err, fs.ErrNotExist) {
				return nil, nil
			}
			return file, err
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	if served {
		streamfs.ServeEveryRead(m)
	}
	// The mount's own: /dev/fuse and its copy, the opens log, and the like.
	const mountOwn = 8
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			if n := int64(openFDs(t, cached, scratch).notPipes()); n > peak.Load() {
				peak.Store(n)
			}
		}
	}()
	var wg sync.WaitGroup
	var bad atomic.Int64
	for r := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			order := rand.New(rand.NewPCG(uint64(r), 1)).Perm(files)
			for _, i := range order {
				key := fmt.Sprintf("f%03d.bin", i)
				got, err := os.ReadFile(filepath.Join(dir, key))
				if err != nil || !bytes.Equal(got, data[key]) {
					bad.Add(1)
					t.Errorf("reader %d: %s: %d bytes, err %v: not the file's bytes", r, key, len(got), err)
				}
			}
		}()
	}
	wg.Wait()
	settle(t, limit, bound)
	close(stop)
	<-sampled
	if bad.Load() != 0 {
		t.Fatalf("%d reads wrong", bad.Load())
	}
	after := openFDs(t, cached, scratch)
	t.Logf("descriptors (pipes apart): %d before the mount, %d after %d reads of %d files (%d of them the mount's files), peak %d; pipes %d before, %d after; the bound closed %d files, holds %d; %d reads served",
		base.notPipes(), after.notPipes(), files*readers, files, after.under, peak.Load(), base.pipes, after.pipes, limit.Closed(), limit.Open(), m.Reads())
	// The files the mount holds open are the bound's, its opens log and its scratch directory,
	// and nothing else of it grows with reads.
	if after.under > bound+2 {
		t.Errorf("%d of the cache's and scratch files open after the reads, want at most the bound, %d, the opens log and the scratch directory", after.under, bound)
	}
	if after.notPipes() > base.notPipes()+bound+mountOwn {
		t.Errorf("%d descriptors open after the reads, want at most %d (before %d, bound %d)", after.notPipes(), base.notPipes()+bound+mountOwn, base.notPipes(), bound)
	}
	// In use at once: one per reader's open file, one per request the server answers.
	if p := peak.Load(); p > int64(base.notPipes()+bound+mountOwn+2*readers+16) {
		t.Errorf("peak of %d descriptors during the reads, want at most %d", p, base.notPipes()+bound+mountOwn+2*readers+16)
	}
	if limit.Open() > bound {
		t.Errorf("the bound holds %d files, want at most %d", limit.Open(), bound)
	}
	// Every read of a cached file reached Read: the kernel's page cache answers only later opens.
	if served && m.Reads() < files {
		t.Errorf("%d reads served, want every file's at least", m.Reads())
	}
	if limit.Closed() == 0 {
		t.Error("the bound closed no file: the test read too few")
	}
}

// TestBackingFilesBound opens 20,000 cached files once each, one after another, through a mount
// bounded to 64 open files, passed through to the kernel: each file passed through is held open
// by the kernel itself (its backing file), beyond this process's descriptors, so the count is
// the kernel's. The cache's copies live on a tmpfs of the test's own; once all are deleted, an
// inode still in use there is a file still open, by this process or by the kernel. At most the
// bound, where every file ever passed through stayed registered for the life of the mount
// (20,000).
func TestBackingFilesBound(t *testing.T) {
	requireFUSE(t)
	const files, bound = 20000, 64
	cached := t.TempDir()
	if err := syscall.Mount("tmpfs", cached, "tmpfs", 0, "mode=0755,nr_inodes=100000"); err != nil {
		t.Fatalf("mounting a tmpfs for the cache: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(cached, syscall.MNT_DETACH) })
	data := map[string][]byte{}
	var objs []source.Object
	for i := range files {
		key := fmt.Sprintf("f%05d", i)
		data[key] = []byte("the bytes of " + key)
		objs = append(objs, source.Object{Key: key, Type: source.File, Size: int64(len(data[key]))})
		if err := os.WriteFile(filepath.Join(cached, key), data[key], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	limit := streamfs.NewOpenFiles(bound)
	m, err := streamfs.Start(dir, streamfs.Config{Objects: objs, Scratch: t.TempDir(), Files: limit,
		Fetcher: memFetcher{data: data, partN: 1 << 20},
		Cached:  func(o source.Object) (*os.File, error) { return os.Open(filepath.Join(cached, o.Key)) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	read := func(i int) {
		key := fmt.Sprintf("f%05d", i)
		if got, err := os.ReadFile(filepath.Join(dir, key)); err != nil || !bytes.Equal(got, data[key]) {
			t.Fatalf("%s: %q, %v; want %q", key, got, err, data[key])
		}
	}
	for i := range files {
		read(i)
	}
	// Read again, long after the bound dropped their registrations: registered again.
	for i := range 100 {
		read(i)
	}
	if m.Reads() != 0 {
		t.Fatalf("%d reads reached the server: the files were not passed through, the test proves nothing", m.Reads())
	}
	settle(t, limit, bound)
	for key := range data {
		if err := os.Remove(filepath.Join(cached, key)); err != nil {
			t.Fatal(err)
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(cached, &st); err != nil {
		t.Fatal(err)
	}
	held := int64(st.Files-st.Ffree) - 1 // the tmpfs's root
	t.Logf("%d files opened once (and 100 again) under a bound of %d: %d of the cache's copies still open after all were deleted; the bound closed %d, holds %d",
		files, bound, held, limit.Closed(), limit.Open())
	if held > bound {
		t.Errorf("%d of the cache's copies are still open (by the kernel, as backing files, or by the plugin), want at most the bound, %d", held, bound)
	}
}

// settle waits for the kernel's releases of the last opens, which it sends after close(2) has
// returned: each leaves its file's registration to the bound, which then holds.
func settle(t *testing.T, limit *streamfs.OpenFiles, bound int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); limit.Open() > bound; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the bound holds %d files a minute after the last read, want at most %d", limit.Open(), bound)
		}
	}
}
