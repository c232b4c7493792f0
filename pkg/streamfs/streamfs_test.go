package streamfs_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"hash/crc32"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource/s3source"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/pkg/streamfs"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

const partSize = 5 << 20 // S3's smallest multipart part

func randomBytes(seed uint64, n int64) []byte {
	r := rand.NewChaCha8([32]byte{byte(seed)})
	b := make([]byte, n)
	_, _ = r.Read(b)
	return b
}

// partsFetcher reads from the real source and reports, for the keys it knows, the per-part
// CRC32Cs the uploader computed: what S3 reports (GetObjectAttributes) for an object uploaded
// with checksums. versitygw v1.8.0 does not report parts, so the test brings them.
type partsFetcher struct {
	streamfs.SourceFetcher
	parts map[string][]source.Part
}

func (p partsFetcher) Layout(ctx context.Context, obj source.Object) (streamfs.Layout, error) {
	if parts, ok := p.parts[obj.Key]; ok {
		return streamfs.Layout{Parts: parts}, nil
	}
	return p.SourceFetcher.Layout(ctx, obj)
}

func crcParts(data []byte) []source.Part {
	var parts []source.Part
	for off := int64(0); off < int64(len(data)); off += partSize {
		n := min(partSize, int64(len(data))-off)
		c := crc32.Checksum(data[off:off+n], crc32.MakeTable(crc32.Castagnoli))
		sum := []byte{byte(c >> 24), byte(c >> 16), byte(c >> 8), byte(c)}
		parts = append(parts, source.Part{Off: off, N: n,
			Checksum: source.Checksum{Algorithm: "CRC32C", Value: base64.StdEncoding.EncodeToString(sum)}})
	}
	return parts
}

type fixture struct {
	s3     *testpeers.S3
	proxy  *testpeers.Proxy
	dir    string // the mount
	want   map[string][]byte
	parts  map[string][]source.Part
	cached string
	objs   []source.Object
}

func requireFUSE(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testutil.Unavailable(t, "streaming mounts need root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testutil.Unavailable(t, "no /dev/fuse: %v", err)
	}
}

// newFixture uploads a dataset to versitygw behind a counting proxy and lists it.
func newFixture(t *testing.T) *fixture {
	requireFUSE(t)
	f := &fixture{s3: testpeers.StartS3(t, ""), want: map[string][]byte{}, parts: map[string][]source.Part{}}
	f.proxy = testpeers.StartProxy(t, f.s3.Endpoint, nil)
	f.s3.Bucket(t, "data")
	for key, size := range map[string]int64{"big.bin": 6*partSize + 12345, "corrupt.bin": 2 * partSize, "cached.bin": 3 << 20, "cached2.bin": 3 << 20, "control.bin": 2 * partSize, "ahead.bin": 5 * partSize, "late.bin": 1 << 20} {
		data := randomBytes(uint64(crc32.ChecksumIEEE([]byte(key))), size)
		f.s3.PutMultipart(t, "data", key, size, partSize, func(i int, buf []byte) { copy(buf, data[int64(i)*partSize:]) })
		f.want[key], f.parts[key] = data, crcParts(data)
	}
	for key, data := range map[string][]byte{"dir/small.txt": []byte("hello, streaming\n"), "dir/sub/flip.txt": randomBytes(7, 1000),
		"empty": nil, "changed.txt": []byte("first version"), "noroom.txt": []byte("no room")} {
		f.s3.Put(t, "data", key, data)
		f.want[key] = data
	}
	src := f.source(t)
	if err := src.List(context.Background(), func(o source.Object) error { f.objs = append(f.objs, o); return nil }); err != nil {
		t.Fatal(err)
	}
	f.objs = append(f.objs, source.Object{Key: "dir/link", Type: source.Symlink, Target: "small.txt"})
	// "cached.bin" and "cached2.bin" are already in the node cache.
	f.cached = t.TempDir()
	for _, key := range []string{"cached.bin", "cached2.bin"} {
		if err := os.WriteFile(filepath.Join(f.cached, key), f.want[key], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f.dir = filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(f.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) source(t *testing.T) source.Source {
	src, err := s3source.New(s3source.Config{Bucket: "data", Endpoint: f.proxy.URL, PathStyle: true,
		AccessKeyID: f.s3.AccessKey, SecretAccessKey: f.s3.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return src
}

// mount serves the dataset; the mount goes away when the test ends, whatever happens.
// room, when set, plays a full pool.
var room atomic.Bool

func (f *fixture) mount(t *testing.T, fetcher streamfs.Fetcher, fetches *atomic.Int64) *streamfs.Mount {
	m, err := streamfs.Start(f.dir, streamfs.Config{
		Objects: f.objs, Scratch: t.TempDir(), Fetcher: fetcher,
		Cached: func(o source.Object) (*os.File, error) {
			file, err := os.Open(filepath.Join(f.cached, o.Key))
			if errors.Is(err, fs.ErrNotExist) {
				return nil, nil
			}
			return file, err
		},
		OnFetch: func(string, int64, int64, error) { fetches.Add(1) },
		Room: func(context.Context, int64) error {
			if room.Load() {
				return errors.New("pool full")
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("unmount: %v", err)
			_ = exec.Command("umount", "-l", f.dir).Run()
		}
	})
	return m
}

func (f *fixture) gets(key string) int { return f.proxy.Gets("/data/" + key) }

func TestStreaming(t *testing.T) {
	f := newFixture(t)
	var fetches atomic.Int64
	m := f.mount(t, partsFetcher{streamfs.SourceFetcher{Source: f.source(t)}, f.parts}, &fetches)

	t.Run("every entry visible before any byte is read", func(t *testing.T) {
		seen := map[string]int64{}
		err := filepath.WalkDir(f.dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(f.dir, p)
			seen[rel] = info.Size()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for key, data := range f.want {
			if got, ok := seen[key]; !ok || got != int64(len(data)) {
				t.Errorf("%s: listed %v with size %d, want size %d", key, ok, got, len(data))
			}
		}
		if target, err := os.Readlink(filepath.Join(f.dir, "dir/link")); err != nil || target != "small.txt" {
			t.Errorf("symlink: %q, %v", target, err)
		}
		if n := fetches.Load(); n != 0 {
			t.Errorf("listing fetched %d parts, want 0", n)
		}
	})

	t.Run("a byte in the middle of an uncached large file costs one ranged GET", func(t *testing.T) {
		file, err := os.Open(filepath.Join(f.dir, "big.bin"))
		if err != nil {
			t.Fatal(err)
		}
		defer file.Close()
		off := int64(3*partSize + 777)
		b := make([]byte, 1)
		if _, err := file.ReadAt(b, off); err != nil {
			t.Fatal(err)
		}
		if b[0] != f.want["big.bin"][off] {
			t.Fatalf("byte %d: %x, want %x", off, b[0], f.want["big.bin"][off])
		}
		if n := f.gets("big.bin"); n != 1 {
			t.Errorf("%d GETs of big.bin, want 1 (the part holding the byte)", n)
		}
		all, err := os.ReadFile(filepath.Join(f.dir, "big.bin"))
		if err != nil || !bytes.Equal(all, f.want["big.bin"]) {
			t.Fatalf("big.bin differs from the source (err %v)", err)
		}
		if n, parts := f.gets("big.bin"), len(f.parts["big.bin"]); n != parts {
			t.Errorf("%d GETs of big.bin after reading it all, want one per part (%d)", n, parts)
		}
	})

	t.Run("whole small objects and cached files are byte-identical", func(t *testing.T) {
		for _, key := range []string{"dir/small.txt", "empty", "cached.bin", "dir/link"} {
			got, err := os.ReadFile(filepath.Join(f.dir, key))
			want := f.want[key]
			if key == "dir/link" {
				want = f.want["dir/small.txt"]
			}
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("%s: %d bytes, err %v; want the source's %d bytes", key, len(got), err, len(want))
			}
		}
		if n := f.gets("cached.bin"); n != 0 {
			t.Errorf("cached.bin: %d GETs, want 0 (served from the cache)", n)
		}
	})

	t.Run("fully cached files are passed through to the kernel", func(t *testing.T) {
		// readAt reads 4 KiB of a file at off, pages never read through the mount, and returns
		// how many reads reached the server meanwhile.
		readAt := func(key string, off int64) int64 {
			before := m.Reads()
			file, err := os.Open(filepath.Join(f.dir, key))
			if err != nil {
				t.Fatal(err)
			}
			defer file.Close()
			b := make([]byte, 4096)
			if _, err = file.ReadAt(b, off); err != nil || !bytes.Equal(b, f.want[key][off:off+4096]) {
				t.Fatalf("%s at %d: %v", key, off, err)
			}
			return m.Reads() - before
		}
		size := int64(len(f.want["control.bin"]))
		// The control: a file being fetched is read by the server.
		if n := readAt("control.bin", 0); n == 0 {
			t.Fatal("control.bin: no read reached the server; the test cannot tell passthrough apart")
		}
		if n := readAt("cached2.bin", 1<<20); n != 0 {
			t.Errorf("cached2.bin (in the cache): %d reads reached the server, want 0 (passthrough)", n)
		}
		// Once its last part is fetched, control.bin is whole in the scratch file: an open passes
		// it through once the plugin has seen the earlier opens released (the kernel sends
		// RELEASE after close returns, so an open or two may still be served by the plugin).
		readAt("control.bin", size-4096)
		tries := 0
		for n := int64(-1); n != 0; tries++ {
			if tries == 20 {
				t.Fatalf("control.bin (fetched whole): still read by the server after %d opens, want passthrough", tries)
			}
			if tries > 0 {
				time.Sleep(10 * time.Millisecond)
			}
			n = readAt("control.bin", size/2+int64(tries)*4096)
		}
		t.Logf("control.bin passed through at open %d after it was whole", tries)
	})

	t.Run("a file the cache got after it was opened is read from the cache", func(t *testing.T) {
		file, err := os.Open(filepath.Join(f.dir, "late.bin"))
		if err != nil {
			t.Fatal(err)
		}
		defer file.Close()
		if err := os.WriteFile(filepath.Join(f.cached, "late.bin"), f.want["late.bin"], 0o644); err != nil {
			t.Fatal(err)
		}
		if all, err := io.ReadAll(file); err != nil || !bytes.Equal(all, f.want["late.bin"]) {
			t.Fatalf("late.bin differs from the source (err %v)", err)
		}
		if n := f.gets("late.bin"); n != 0 {
			t.Errorf("late.bin: %d GETs, want 0 (in the cache by the time it was read)", n)
		}
	})

	t.Run("a sequential read fetches the next parts ahead", func(t *testing.T) {
		file, err := os.Open(filepath.Join(f.dir, "ahead.bin"))
		if err != nil {
			t.Fatal(err)
		}
		defer file.Close()
		b := make([]byte, 4096)
		if _, err := file.ReadAt(b, 0); err != nil || !bytes.Equal(b, f.want["ahead.bin"][:4096]) {
			t.Fatalf("first read: %v", err)
		}
		// Part 0 for the read, parts 1-3 ahead of it; part 4 waits for a read near it.
		for deadline := time.Now().Add(30 * time.Second); f.gets("ahead.bin") < 4 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		if n := f.gets("ahead.bin"); n != 4 {
			t.Errorf("%d GETs of ahead.bin after its first read, want 4 (its part and 3 ahead)", n)
		}
		all, err := io.ReadAll(file)
		if err != nil || !bytes.Equal(all, f.want["ahead.bin"]) {
			t.Fatalf("ahead.bin differs from the source (err %v)", err)
		}
		if n := f.gets("ahead.bin"); n != 5 {
			t.Errorf("%d GETs of ahead.bin read whole, want one per part (5)", n)
		}
	})

	t.Run("a corrupted range is refused, then read again", func(t *testing.T) {
		f.proxy.SetFaults(func(r *http.Request, _ int64) testpeers.Fault {
			if r.Method == http.MethodGet && (strings.HasSuffix(r.URL.Path, "/corrupt.bin") || strings.HasSuffix(r.URL.Path, "/flip.txt")) {
				return testpeers.Fault{ResetAfter: -1, Flip: true}
			}
			return testpeers.None
		})
		for _, key := range []string{"corrupt.bin", "dir/sub/flip.txt"} {
			got, err := os.ReadFile(filepath.Join(f.dir, key))
			if !errors.Is(err, syscall.EIO) {
				t.Errorf("%s with a flipped byte: %d bytes, err %v; want EIO", key, len(got), err)
			}
		}
		f.proxy.SetFaults(nil)
		for _, key := range []string{"corrupt.bin", "dir/sub/flip.txt"} {
			got, err := os.ReadFile(filepath.Join(f.dir, key))
			if err != nil || !bytes.Equal(got, f.want[key]) {
				t.Errorf("%s after the fault: %d bytes, err %v", key, len(got), err)
			}
		}
	})

	t.Run("an object changed after listing is an error, never the new bytes", func(t *testing.T) {
		f.s3.Put(t, "data", "changed.txt", []byte("second version"))
		got, err := os.ReadFile(filepath.Join(f.dir, "changed.txt"))
		if !errors.Is(err, syscall.EIO) {
			t.Errorf("changed.txt: %q, err %v; want EIO", got, err)
		}
	})

	t.Run("no room on the pool refuses the read before any GET", func(t *testing.T) {
		room.Store(true)
		defer room.Store(false)
		got, err := os.ReadFile(filepath.Join(f.dir, "noroom.txt"))
		if !errors.Is(err, syscall.EIO) {
			t.Errorf("noroom.txt with a full pool: %q, err %v; want EIO", got, err)
		}
		if n := f.gets("noroom.txt"); n != 0 {
			t.Errorf("noroom.txt: %d GETs with a full pool, want 0", n)
		}
	})

	t.Run("read-only", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(f.dir, "new"), nil, 0o644); err == nil {
			t.Error("created a file in a streaming volume")
		}
		if _, err := os.OpenFile(filepath.Join(f.dir, "dir/small.txt"), os.O_WRONLY, 0); err == nil {
			t.Error("opened a file for writing")
		}
	})
}
