package image

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cistern-csi/cistern/test/testutil"
)

func allocated(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Blocks * 512
}

func TestCreateReservesBlocks(t *testing.T) {
	dir := t.TempDir()
	p := VolumePath(dir, ".cistern", "v1")
	if err := Create(p, 8<<20); err != nil {
		t.Fatal(err)
	}
	if got := allocated(t, p); got < 8<<20 {
		t.Fatalf("allocated %d bytes, want the whole 8 MiB reserved", got)
	}
	if err := Grow(p, 16<<20); err != nil {
		t.Fatal(err)
	}
	if size, _ := Size(p); size != 16<<20 {
		t.Fatalf("size after grow = %d", size)
	}
	if err := Grow(p, 4<<20); err == nil {
		t.Fatal("shrinking must fail")
	}
	if err := Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := Remove(p); err != nil {
		t.Fatal("removing twice must succeed")
	}
}

func TestCreateFromCopiesDataAndKeepsHoles(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src.img")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	payload := bytes.Repeat([]byte("cistern!"), 4096)
	if _, err := f.WriteAt(payload, 32<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()

	snap := SnapshotPath(dir, ".cistern", "s1")
	if err := CreateFrom(snap, src, 0); err != nil {
		t.Fatal(err)
	}
	if got := allocated(t, snap); got > 4<<20 {
		t.Fatalf("snapshot allocated %d bytes: holes were filled", got)
	}
	data := make([]byte, len(payload))
	g, _ := os.Open(snap)
	defer g.Close()
	if _, err := g.ReadAt(data, 32<<20); err != nil || !bytes.Equal(data, payload) {
		t.Fatalf("data not copied: %v", err)
	}

	vol := VolumePath(dir, ".cistern", "v2")
	if err := CreateFrom(vol, snap, 128<<20); err != nil {
		t.Fatal(err)
	}
	if size, _ := Size(vol); size != 128<<20 {
		t.Fatalf("restored volume size = %d", size)
	}
}

func TestLoopAttachIsIdempotent(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "v.img")
	if err := Create(p, 4<<20); err != nil {
		t.Fatal(err)
	}
	dev, err := Attach(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Detach(dev) })
	again, err := Attach(p)
	if err != nil || again != dev {
		t.Fatalf("second attach = %q, %v; want %q", again, err, dev)
	}
	if found, _ := Find(p); found != dev {
		t.Fatalf("Find = %q, want %q", found, dev)
	}
	// Found whatever the path it is named by: through a linked directory, or a link to the image.
	linkDir, link := filepath.Join(t.TempDir(), "d"), filepath.Join(t.TempDir(), "link.img")
	if err := os.Symlink(dir, linkDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(p, link); err != nil {
		t.Fatal(err)
	}
	for _, via := range []string{filepath.Join(linkDir, "v.img"), link} {
		if found, _ := Find(via); found != dev {
			t.Errorf("Find(%s) = %q, want %q", via, found, dev)
		}
	}
	// Another image of the same name is another file.
	other := filepath.Join(t.TempDir(), "v.img")
	if err := Create(other, 4<<20); err != nil {
		t.Fatal(err)
	}
	if found, _ := Find(other); found != "" {
		t.Errorf("Find(%s) = %q, want none", other, found)
	}
	if size, err := DeviceSize(dev); err != nil || size != 4<<20 {
		t.Fatalf("device size = %d, %v", size, err)
	}
	if err := Grow(p, 8<<20); err != nil {
		t.Fatal(err)
	}
	if err := RefreshSize(dev); err != nil {
		t.Fatal(err)
	}
	if size, _ := DeviceSize(dev); size != 8<<20 {
		t.Fatalf("device size after refresh = %d", size)
	}
	if err := Detach(dev); err != nil {
		t.Fatal(err)
	}
	if found, _ := Find(p); found != "" {
		t.Fatalf("still attached as %s", found)
	}
}
