package writeback_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cistern-csi/cistern/pkg/overlayfs"
	"github.com/cistern-csi/cistern/pkg/writeback"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// overlayVolume stacks a real overlay on lower (the dataset), lets change write through it as a
// pod would, unmounts it and returns the upper directory and what the pod sees (path -> bytes).
func overlayVolume(t *testing.T, lower map[string][]byte, change func(merged string)) (string, map[string][]byte) {
	t.Helper()
	return overlayVolumeWith(t, "", lower, change)
}

// overlayVolumeWith is overlayVolume with more overlay options (e.g. the driver's metacopy).
func overlayVolumeWith(t *testing.T, options string, lower map[string][]byte, change func(merged string)) (string, map[string][]byte) {
	t.Helper()
	testutil.RequireRoot(t)
	dir := t.TempDir()
	lo, up, work, merged := filepath.Join(dir, "lower"), filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "merged")
	for p, b := range lower {
		writeFile(t, filepath.Join(lo, p), b)
	}
	for _, d := range []string{lo, up, work, merged} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if options != "" {
		options = "," + options
	}
	if err := unix.Mount("overlay", merged, "overlay", 0, "lowerdir="+lo+",upperdir="+up+",workdir="+work+options); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	mounted := true
	t.Cleanup(func() {
		if mounted {
			_ = unix.Unmount(merged, unix.MNT_DETACH)
		}
	})
	change(merged)
	seen := map[string][]byte{}
	err := filepath.WalkDir(merged, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(merged, p)
		seen[filepath.ToSlash(rel)] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Unmount(merged, 0); err != nil {
		t.Fatal(err)
	}
	mounted = false
	return up, seen
}

// TestUploadChanges writes through a real overlay on a dataset and uploads the changes to
// versitygw: the objects are byte-identical to what the pod sees, unchanged dataset files are not
// sent, deletions are made when asked, and a second Run sends nothing.
func TestUploadChanges(t *testing.T) {
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "out")
	// What an earlier run left at the target: the pod deletes these paths.
	s.Put(t, "out", "run/gone.txt", []byte("old"))
	s.Put(t, "out", "run/olddir/x", []byte("old"))
	lower := map[string][]byte{
		"kept.bin": randBytes(1, 3<<20), "changed.bin": randBytes(2, 6<<20),
		"gone.txt": []byte("gone"), "olddir/x": []byte("x"),
	}
	big := randBytes(3, 23<<20+17) // 5 parts of 5 MiB, the last short
	upper, seen := overlayVolume(t, lower, func(m string) {
		writeFile(t, filepath.Join(m, "ckpt/big.bin"), big)
		writeFile(t, filepath.Join(m, "ckpt/small.json"), []byte(`{"step":1}`))
		writeFile(t, filepath.Join(m, "empty"), nil)
		f, err := os.OpenFile(filepath.Join(m, "changed.bin"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = f.Write([]byte("appended"))
		f.Close()
		if err := os.Remove(filepath.Join(m, "gone.txt")); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(m, "olddir")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("kept.bin", filepath.Join(m, "link")); err != nil {
			t.Fatal(err)
		}
	})
	u, err := writeback.New(writeback.Config{Dir: t.TempDir(), PartSize: 5 << 20, Concurrency: 8})
	if err != nil {
		t.Fatal(err)
	}
	target, err := writeback.ParseTarget("s3://out/run")
	if err != nil {
		t.Fatal(err)
	}
	job := writeback.Job{Volume: "vol-1", Upper: upper, Target: target, Deletes: true}
	var last writeback.Progress
	if err := u.Run(testCtx(t), job, s.Client, func(p writeback.Progress) { last = p }); err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{"ckpt/big.bin": seen["ckpt/big.bin"], "ckpt/small.json": seen["ckpt/small.json"],
		"empty": seen["empty"], "changed.bin": seen["changed.bin"]}
	sameObjects(t, objects(t, s.Client, "out", "run/"), want)
	var changed int64
	for _, b := range want {
		changed += int64(len(b))
	}
	if !last.Done || last.Sent != changed || last.BytesDone != changed || last.Skipped != 1 {
		t.Errorf("progress %+v: want done, %d bytes sent (the changed ones), the symlink skipped", last, changed)
	}
	if n := openUploads(t, s.Client, "out"); n != 0 {
		t.Errorf("%d multipart uploads left open", n)
	}
	if done, err := u.Done("vol-1"); err != nil || !done {
		t.Errorf("Done = %v, %v", done, err)
	}
	if err := u.Run(testCtx(t), job, s.Client, func(p writeback.Progress) { last = p }); err != nil || last.Sent != 0 {
		t.Errorf("second run: %v, sent %d", err, last.Sent)
	}
}

// TestRefusingTarget has the target refuse every write: the job is retried with backoff and its
// failure reported, the data stays, and once the target accepts, the job completes.
func TestRefusingTarget(t *testing.T) {
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "out")
	refuse := func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method == http.MethodPut || r.Method == http.MethodPost {
			return testpeers.Fault{Status: http.StatusForbidden, Code: "AccessDenied", ResetAfter: -1}
		}
		return testpeers.None
	}
	proxy := testpeers.StartProxy(t, s.Endpoint, refuse)
	upper := t.TempDir()
	want := map[string][]byte{"a.txt": []byte("a"), "d/b.bin": randBytes(4, 7<<20)}
	for p, b := range want {
		writeFile(t, filepath.Join(upper, p), b)
	}
	u, err := writeback.New(writeback.Config{Dir: t.TempDir(), PartSize: 5 << 20, MinBackoff: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		refused []writeback.Progress
		retried = make(chan struct{})
	)
	report := func(p writeback.Progress) {
		mu.Lock()
		defer mu.Unlock()
		if p.Err != nil {
			refused = append(refused, p)
			if len(refused) == 3 {
				close(retried)
			}
		}
	}
	done := make(chan error, 1)
	go func() {
		done <- u.Run(testCtx(t), writeback.Job{Volume: "v", Upper: upper, Target: writeback.Target{Bucket: "out"}}, clientFor(s, proxy.URL), report)
	}()
	select {
	case <-retried:
	case err := <-done:
		t.Fatalf("Run ended while the target refused: %v", err)
	}
	mu.Lock()
	last := refused[len(refused)-1]
	mu.Unlock()
	if last.Attempt < 3 || !strings.Contains(last.Err.Error(), "AccessDenied") || last.Done {
		t.Errorf("reported %+v, want a third attempt failing with AccessDenied", last)
	}
	if ok, _ := u.Done("v"); ok {
		t.Error("Done while the target refuses")
	}
	for p, b := range want {
		if got, err := os.ReadFile(filepath.Join(upper, p)); err != nil || string(got) != string(b) {
			t.Errorf("%s: the data did not stay: %v", p, err)
		}
	}
	proxy.SetFaults(nil)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sameObjects(t, objects(t, s.Client, "out", ""), want)
}

func TestParseTarget(t *testing.T) {
	for in, want := range map[string]writeback.Target{
		"s3://b": {Bucket: "b"}, "s3://b/": {Bucket: "b"}, "s3://b/p/q/": {Bucket: "b", Prefix: "p/q/"},
		"nfs://h:2049/export/out": {Host: "h:2049", Prefix: "export/out/"}, "nfs://h/export": {Host: "h", Prefix: "export/"},
	} {
		if got, err := writeback.ParseTarget(in); err != nil || got != want {
			t.Errorf("%s: %+v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "b/p", "nfs://h", "nfs://h/", "nfs:///export", "ftp://h/p", "s3:///p", "s3://b/../x", "s3://k:s@b/p", "s3://b/p?x=1", "s3://b/p//q"} {
		if _, err := writeback.ParseTarget(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestDeletionsFromLower deletes through a real overlay a dataset file, a dataset directory, and
// a dataset directory made again (opaque), and uploads with deletions and the lower directory:
// exactly the dataset's objects the pod no longer sees are deleted at the target; what the
// target holds beside them (never in the dataset) and what the pod wrote again stay.
func TestDeletionsFromLower(t *testing.T) {
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "out")
	lower := map[string][]byte{
		"a.txt": []byte("a"), "keep.txt": []byte("k"),
		"gone/x": []byte("x"), "gone/sub/y": []byte("y"),
		"remade/old1": []byte("1"), "remade/old2": []byte("2"), "remade/again": []byte("v1"),
	}
	// The target mirrors the dataset (an earlier sync), and holds one object the dataset lacks
	// under each directory the pod deletes.
	for p, b := range lower {
		s.Put(t, "out", "sync/"+p, b)
	}
	s.Put(t, "out", "sync/gone/not-in-dataset", []byte("n"))
	s.Put(t, "out", "sync/remade/not-in-dataset", []byte("n"))
	dir := t.TempDir()
	lo := filepath.Join(dir, "lower")
	for p, b := range lower {
		writeFile(t, filepath.Join(lo, p), b)
	}
	upper, _ := overlayVolume(t, lower, func(m string) {
		for _, p := range []string{"a.txt", "gone", "remade"} {
			if err := os.RemoveAll(filepath.Join(m, p)); err != nil {
				t.Fatal(err)
			}
		}
		writeFile(t, filepath.Join(m, "remade/again"), []byte("v2"))
		writeFile(t, filepath.Join(m, "new/file"), []byte("new"))
	})
	u, err := writeback.New(writeback.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	job := writeback.Job{Volume: "v", Upper: upper, Lower: lo, Target: writeback.Target{Bucket: "out", Prefix: "sync/"}, Deletes: true}
	if err := u.Run(testCtx(t), job, s.Client, nil); err != nil {
		t.Fatal(err)
	}
	sameObjects(t, objects(t, s.Client, "out", "sync/"), map[string][]byte{
		"keep.txt": []byte("k"), "gone/not-in-dataset": []byte("n"), "remade/not-in-dataset": []byte("n"),
		"remade/again": []byte("v2"), "new/file": []byte("new"),
	})
}

// TestRenamedFromDataset renames a dataset file and a dataset directory through a real overlay
// with the driver's options (metacopy, redirect_dir: the data stays in the lower layer), changes
// and deletes below the renamed directory, and uploads with the lower directory and deletions:
// the target ends as the pod sees the volume, the renamed files read from the dataset.
func TestRenamedFromDataset(t *testing.T) {
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "out")
	lower := map[string][]byte{"a.bin": randBytes(11, 3<<10), "dir/x": []byte("x"), "dir/sub/y": []byte("y"), "dir/z": []byte("z"), "keep": []byte("k")}
	for p, b := range lower {
		s.Put(t, "out", "sync/"+p, b)
	}
	dir := t.TempDir()
	lo := filepath.Join(dir, "lower")
	for p, b := range lower {
		writeFile(t, filepath.Join(lo, p), b)
	}
	upper, seen := overlayVolumeWith(t, "redirect_dir=on,metacopy=on,index=off", lower, func(m string) {
		for _, mv := range [][2]string{{"a.bin", "moved.bin"}, {"dir", "newdir"}} {
			if err := os.Rename(filepath.Join(m, mv[0]), filepath.Join(m, mv[1])); err != nil {
				t.Fatal(err)
			}
		}
		writeFile(t, filepath.Join(m, "newdir/z"), []byte("z2"))
		if err := os.Remove(filepath.Join(m, "newdir/sub/y")); err != nil {
			t.Fatal(err)
		}
	})
	changes, err := overlayfs.Changes(upper)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]overlayfs.Change{}
	for _, c := range changes {
		kinds[c.Path] = c
	}
	if c := kinds["moved.bin"]; c.Kind != overlayfs.Metadata || c.From != "a.bin" {
		t.Fatalf("moved.bin in the upper directory: %+v, want a metacopy from a.bin (the kernel's metacopy)", c)
	}
	if c := kinds["newdir"]; c.Kind != overlayfs.Dir || c.From != "dir" {
		t.Fatalf("newdir in the upper directory: %+v, want a redirect from dir", c)
	}
	u, err := writeback.New(writeback.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	job := writeback.Job{Volume: "v", Upper: upper, Lower: lo, Target: writeback.Target{Bucket: "out", Prefix: "sync/"}, Deletes: true}
	var last writeback.Progress
	if err := u.Run(testCtx(t), job, s.Client, func(p writeback.Progress) { last = p }); err != nil {
		t.Fatal(err)
	}
	sameObjects(t, objects(t, s.Client, "out", "sync/"), seen)
	if want := int64(len(lower["a.bin"]) + 1 + 2); last.Sent != want {
		t.Errorf("sent %d bytes, want %d: moved.bin, newdir/x and newdir/z", last.Sent, want)
	}
}
