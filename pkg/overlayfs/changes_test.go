package overlayfs

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cistern-csi/cistern/test/testutil"
	"golang.org/x/sys/unix"
)

// TestChanges makes each kind of change through a real overlay (the kernel writes the upper
// directory) and reads it back.
func TestChanges(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	lower, upper, work, merged := filepath.Join(dir, "lower"), filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "merged")
	for p, data := range map[string]string{"gone.txt": "x", "kept.txt": "k", "replaced/old.txt": "o", "moved/m.txt": "m", "mode.bin": "data"} {
		write(t, filepath.Join(lower, p), data)
	}
	for _, d := range []string{upper, work, merged} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work + ",redirect_dir=on,metacopy=on,index=off"
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		testutil.Unavailable(t, "overlay with metacopy: %v", err)
	}
	mounted := true
	t.Cleanup(func() {
		if mounted {
			_ = unix.Unmount(merged, unix.MNT_DETACH)
		}
	})
	m := func(p string) string { return filepath.Join(merged, p) }
	must(t, os.Remove(m("gone.txt")))
	must(t, os.RemoveAll(m("replaced")))
	must(t, os.Mkdir(m("replaced"), 0o755))
	must(t, os.Rename(m("moved"), m("renamed")))
	must(t, os.Chmod(m("mode.bin"), 0o600))
	write(t, m("new/n.txt"), "n")
	must(t, unix.Unmount(merged, 0))
	mounted = false

	cs, err := Changes(upper)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Change{}
	for _, c := range cs {
		got[c.Path] = c
	}
	want := []Change{
		{Path: "gone.txt", Kind: Deleted},
		{Path: "replaced", Kind: Opaque},
		{Path: "renamed", Kind: Dir, From: "moved"},
		{Path: "moved", Kind: Deleted},
		{Path: "mode.bin", Kind: Metadata},
		{Path: "new", Kind: Opaque}, // a directory the pod made hides nothing, but is marked so
		{Path: "new/n.txt", Kind: Written},
	}
	for _, w := range want {
		if got[w.Path] != w {
			t.Errorf("%s: %+v, want %+v", w.Path, got[w.Path], w)
		}
	}
	if _, ok := got["kept.txt"]; ok {
		t.Error("an unchanged file is listed")
	}
	paths := make([]string, 0, len(cs))
	for _, c := range cs {
		paths = append(paths, c.Path)
	}
	if i, j := slices.Index(paths, "new"), slices.Index(paths, "new/n.txt"); i < 0 || j < i {
		t.Errorf("parents before children: %v", paths)
	}
}

func write(t *testing.T, p, data string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, []byte(data), 0o644))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
