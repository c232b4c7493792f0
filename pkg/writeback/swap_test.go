package writeback_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cistern-csi/cistern/pkg/writeback"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// swapVolume is an upper directory whose four files a pod swaps after a pass listed them, and
// what of the node each swap points at.
type swapVolume struct {
	upper, outside string
	// secret is a root-only file of the node, and outside/d/x another directory's file, each of
	// the planned files' size; replacement is the file renamed over same.bin (same size and
	// mtime, another inode).
	secret, dirFile, replacement []byte
}

const swapSize = 4096

func newSwapVolume(t *testing.T) *swapVolume {
	t.Helper()
	if os.Geteuid() != 0 {
		testutil.Unavailable(t, "needs root to make a device node")
	}
	v := &swapVolume{upper: t.TempDir(), outside: t.TempDir(),
		secret: randBytes(31, swapSize), dirFile: randBytes(32, swapSize), replacement: randBytes(33, swapSize)}
	if err := os.WriteFile(filepath.Join(v.outside, "key"), v.secret, 0o600); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(v.outside, "d", "x"), v.dirFile)
	for i, p := range []string{"a.txt", "d/x", "same.bin", "dev.bin"} {
		writeFile(t, filepath.Join(v.upper, p), randBytes(uint64(40+i), swapSize))
	}
	v.age(t, "a.txt", "d/x", "same.bin", "dev.bin")
	return v
}

// age puts the files' mtime a minute back: old enough for a checkpoint to take them.
func (v *swapVolume) age(t *testing.T, paths ...string) {
	t.Helper()
	ago := time.Now().Add(-time.Minute).Truncate(time.Second)
	for _, p := range paths {
		if err := os.Chtimes(filepath.Join(v.upper, p), ago, ago); err != nil {
			t.Fatal(err)
		}
	}
}

// swap is what the pod does once the pass listed the files: a.txt a symlink to the node's key,
// the directory d a symlink to a directory outside holding an x of the same size, same.bin
// another file of its size and mtime renamed over it, dev.bin a device node (/dev/zero's).
func (v *swapVolume) swap(t *testing.T) {
	t.Helper()
	up := func(p string) string { return filepath.Join(v.upper, p) }
	var st unix.Stat_t
	if err := unix.Stat(up("same.bin"), &st); err != nil {
		t.Fatal(err)
	}
	writeFile(t, up("same.new"), v.replacement)
	mtime := time.Unix(st.Mtim.Unix())
	if err := os.Chtimes(up("same.new"), mtime, mtime); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		os.Remove(up("a.txt")), os.Symlink(filepath.Join(v.outside, "key"), up("a.txt")),
		os.RemoveAll(up("d")), os.Symlink(filepath.Join(v.outside, "d"), up("d")),
		os.Rename(up("same.new"), up("same.bin")),
		os.Remove(up("dev.bin")), unix.Mknod(up("dev.bin"), unix.S_IFCHR|0o644, int(unix.Mkdev(1, 5))),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// listedAll reports whether a Progress is the one of a pass that listed the four files, before
// any is sent.
func listedAll(p writeback.Progress) bool { return p.Files == 4 && p.FilesDone == 0 && p.Err == nil }

// noneOfTheNode fails if the target holds any byte of what the swaps pointed at: the node's
// key, the outside directory's file, the device's zeros.
func (v *swapVolume) noneOfTheNode(t *testing.T, got map[string][]byte) {
	t.Helper()
	for k, b := range got {
		switch {
		case bytes.Equal(b, v.secret):
			t.Errorf("%s: the target holds the node's root-only key", k)
		case bytes.Equal(b, v.dirFile):
			t.Errorf("%s: the target holds a file of a directory outside the volume", k)
		case bytes.Equal(b, make([]byte, swapSize)):
			t.Errorf("%s: the target holds the bytes of a device node", k)
		}
	}
}

// TestSwappedAfterPlan: the pod swaps four planned files (a symlink to a root-only file, a
// directory on their path for a symlink to a directory outside, another file of the same size
// and mtime, a device node) once a pass listed them. Nothing outside the upper directory and
// nothing but the planned regular file is sent. A checkpoint leaves the four for the next one,
// which takes the regular file now there and skips the symlinks and the device; the final
// upload refuses the pass (retried, its next pass plans again) and sends only the new file. The
// same through the os.Root fallback of kernels without openat2.
func TestSwappedAfterPlan(t *testing.T) {
	for _, fallback := range []bool{false, true} {
		name := "openat2"
		if fallback {
			name = "os.Root"
		}
		t.Run(name+"/checkpoint", func(t *testing.T) { testSwapCheckpoint(t, fallback) })
		t.Run(name+"/final", func(t *testing.T) { testSwapFinal(t, fallback) })
	}
}

func swapUploader(t *testing.T, fallback bool) (*writeback.Uploader, *testpeers.S3) {
	t.Helper()
	if fallback {
		writeback.WithoutOpenat2(t)
	}
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "out")
	u, err := writeback.New(writeback.Config{Dir: t.TempDir(), PartSize: 5 << 20, MinBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return u, s
}

func testSwapCheckpoint(t *testing.T, fallback bool) {
	v := newSwapVolume(t)
	u, s := swapUploader(t, fallback)
	job := writeback.Job{Volume: "v", Upper: v.upper, Target: writeback.Target{Bucket: "out"}}
	swapped := false
	var last writeback.Progress
	report := func(p writeback.Progress) {
		if !swapped && listedAll(p) {
			swapped = true
			v.swap(t)
		}
		last = p
	}
	if err := u.Checkpoint(testCtx(t), job, s.Client, report); err != nil {
		t.Fatal(err)
	}
	if !swapped {
		t.Fatalf("the checkpoint never listed the four files: %+v", last)
	}
	got := objects(t, s.Client, "out", "")
	v.noneOfTheNode(t, got)
	sameObjects(t, got, nil)
	if last.Deferred != 4 || last.FilesDone != 0 || last.Sent != 0 {
		t.Errorf("first checkpoint: %+v, want the four files left for the next one, nothing sent", last)
	}
	if err := u.Checkpoint(testCtx(t), job, s.Client, report); err != nil {
		t.Fatal(err)
	}
	got = objects(t, s.Client, "out", "")
	v.noneOfTheNode(t, got)
	sameObjects(t, got, map[string][]byte{"same.bin": v.replacement})
	if last.Skipped != 3 || last.FilesDone != 1 || last.Sent != swapSize {
		t.Errorf("second checkpoint: %+v, want the two symlinks and the device skipped, same.bin sent", last)
	}
}

func testSwapFinal(t *testing.T, fallback bool) {
	v := newSwapVolume(t)
	u, s := swapUploader(t, fallback)
	job := writeback.Job{Volume: "v", Upper: v.upper, Target: writeback.Target{Bucket: "out"}}
	if err := u.Add(job); err != nil {
		t.Fatal(err)
	}
	swapped := false
	var refused, last writeback.Progress
	err := u.Run(testCtx(t), job, s.Client, func(p writeback.Progress) {
		if !swapped && listedAll(p) {
			swapped = true
			v.swap(t)
		}
		if p.Err != nil && refused.Err == nil {
			refused = p
		}
		last = p
	})
	if err != nil {
		t.Fatal(err)
	}
	if refused.Err == nil || !strings.Contains(refused.Err.Error(), "no longer the regular file the plan listed") {
		t.Errorf("the pass that found its files swapped: %v, want it refused", refused.Err)
	}
	got := objects(t, s.Client, "out", "")
	v.noneOfTheNode(t, got)
	sameObjects(t, got, map[string][]byte{"same.bin": v.replacement})
	if !last.Done || last.Sent != swapSize || last.Skipped != 3 {
		t.Errorf("final upload: %+v, want done, only same.bin's %d bytes sent, three entries skipped", last, swapSize)
	}
}
