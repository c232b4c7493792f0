//go:build cgo && libnfs

package nfs4source

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// ganesha exports a new directory over NFSv4 from nfs-ganesha and returns it with the server's
// address.
func ganesha(t *testing.T) (string, string) {
	t.Helper()
	export := t.TempDir()
	if err := os.Chmod(export, 0o755); err != nil {
		t.Fatal(err)
	}
	return export, testpeers.StartGaneshaNFSv4(t, export)
}

func write(t *testing.T, p string, b []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// list returns the source's listing by key.
func list(t *testing.T, s source.Source) map[string]source.Object {
	t.Helper()
	got := map[string]source.Object{}
	if err := s.List(context.Background(), func(o source.Object) error { got[o.Key] = o; return nil }); err != nil {
		t.Fatal(err)
	}
	return got
}

// readAll reads obj whole in ranges of n bytes, as the engine does.
func readAll(t *testing.T, s source.Source, obj source.Object, n int64) ([]byte, error) {
	t.Helper()
	var out []byte
	for off := int64(0); off < obj.Size || off == 0; off += n {
		r, err := s.Open(context.Background(), obj, off, min(n, obj.Size-off))
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(r)
		if cerr := r.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, err
		}
		out = append(out, b...)
		if obj.Size == 0 {
			break
		}
	}
	return out, s.Verify(context.Background(), obj)
}

// TestNFSv4Ganesha reads a tree from nfs-ganesha over NFSv4 (the VFS FSAL, graceless, numeric
// owners) as the node's identity would: every file byte-identical (empty, one byte, 3 MiB + 7
// across ranged reads of 1 MiB and whole, unicode names, nested directories), symlinks listed as
// links and never followed, in or out of the dataset, modes kept.
func TestNFSv4Ganesha(t *testing.T) {
	export, server := ganesha(t)
	dir := filepath.Join(export, "data")
	large := make([]byte, 3<<20+7)
	_, _ = rand.NewChaCha8([32]byte{1}).Read(large)
	files := map[string][]byte{
		"empty":                {},
		"one":                  {'x'},
		"large.bin":            large,
		"a/b/c/deep.txt":       []byte("deep\n"),
		"ünïcödé/日本語 name.txt": []byte("unicode\n"),
		"a/executable.sh":      []byte("#!/bin/sh\n"),
	}
	for k, b := range files {
		if b == nil {
			continue
		}
		mode := os.FileMode(0o644)
		if k == "a/executable.sh" {
			mode = 0o755
		}
		write(t, filepath.Join(dir, k), b, mode)
	}
	write(t, filepath.Join(export, "secret"), []byte("outside the dataset"), 0o644)
	if err := os.Symlink("../secret", filepath.Join(dir, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("b/c/deep.txt", filepath.Join(dir, "a", "inside")); err != nil {
		t.Fatal(err)
	}

	s, err := New(Config{Host: server, Path: dir, UID: 65534, GID: 65534})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := list(t, s)
	want := map[string]source.Type{"empty": source.File, "one": source.File, "large.bin": source.File,
		"a": source.Dir, "a/b": source.Dir, "a/b/c": source.Dir, "a/b/c/deep.txt": source.File,
		"ünïcödé": source.Dir, "ünïcödé/日本語 name.txt": source.File, "a/executable.sh": source.File,
		"escape": source.Symlink, "a/inside": source.Symlink}
	if len(got) != len(want) {
		t.Errorf("listed %d entries, want %d: %v", len(got), len(want), got)
	}
	for k, typ := range want {
		if got[k].Type != typ {
			t.Errorf("%s: type %q, want %q", k, got[k].Type, typ)
		}
	}
	if got["escape"].Target != "../secret" || got["a/inside"].Target != "b/c/deep.txt" {
		t.Errorf("link targets %q, %q; want ../secret, b/c/deep.txt", got["escape"].Target, got["a/inside"].Target)
	}
	if got["a/executable.sh"].Mode != 0o755 || got["one"].Mode != 0o644 {
		t.Errorf("modes %o, %o; want 755, 644", got["a/executable.sh"].Mode, got["one"].Mode)
	}
	compared := 0
	for k, b := range files {
		if b == nil {
			continue
		}
		o := got[k]
		if o.Size != int64(len(b)) {
			t.Errorf("%s: size %d, want %d", k, o.Size, len(b))
		}
		for _, chunk := range []int64{1 << 20, max(o.Size, 1)} {
			data, err := readAll(t, s, o, chunk)
			if err != nil {
				t.Fatalf("%s in ranges of %d: %v", k, chunk, err)
			}
			if !bytes.Equal(data, b) {
				t.Errorf("%s in ranges of %d: %d bytes differ from the %d written", k, chunk, len(data), len(b))
			}
			compared++
		}
	}
	t.Logf("%d entries listed, %d reads compared byte for byte", len(got), compared)

	// A link is a link: opening it as the file it names is refused, not followed.
	if _, err := s.Open(context.Background(), source.Object{Key: "escape", Type: source.File, Size: 19, Version: got["one"].Version}, 0, 19); source.KindOf(err) != source.Unsafe {
		t.Errorf("opening the link escape as a file: %v, want an Unsafe error", err)
	}
}

// TestNFSv4Refusals: what the source refuses, each with its kind: a dataset path that is not
// there (NotFound), a file the identity cannot read (Denied: mode 0600 of another uid), a file
// changed since it was listed (Changed), a path that is a file (Invalid).
func TestNFSv4Refusals(t *testing.T) {
	export, server := ganesha(t)
	dir := filepath.Join(export, "data")
	write(t, filepath.Join(dir, "private"), []byte("root's only"), 0o600)
	write(t, filepath.Join(dir, "public"), []byte("anyone's"), 0o644)

	if _, err := New(Config{Host: server, Path: filepath.Join(export, "missing"), UID: 65534, GID: 65534}); source.KindOf(err) != source.NotFound {
		t.Errorf("a missing dataset path: %v, want a NotFound error", err)
	}
	if _, err := New(Config{Host: server, Path: filepath.Join(dir, "public"), UID: 65534, GID: 65534}); source.KindOf(err) != source.Invalid {
		t.Errorf("a file as the dataset path: %v, want an Invalid error", err)
	}
	s, err := New(Config{Host: server, Path: dir, UID: 65534, GID: 65534})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := list(t, s)
	if _, err := readAll(t, s, got["private"], 1<<20); source.KindOf(err) != source.Denied {
		t.Errorf("a 0600 file of uid 0 read as 65534: %v, want a Denied error", err)
	}
	// The same file as its owner is read: the identity the server sees is the configured one.
	owner, err := New(Config{Host: server, Path: dir, UID: 0, GID: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	if b, err := readAll(t, owner, got["private"], 1<<20); err != nil || string(b) != "root's only" {
		t.Errorf("the 0600 file read as its owner: %q, %v", b, err)
	}
	if _, err := readAll(t, s, source.Object{Key: "gone", Type: source.File, Size: 1, Version: "x"}, 1); source.KindOf(err) != source.NotFound {
		t.Errorf("a file not there: %v, want a NotFound error", err)
	}
	write(t, filepath.Join(dir, "public"), []byte("rewritten, longer"), 0o644)
	if _, err := readAll(t, s, got["public"], 1<<20); source.KindOf(err) != source.Changed {
		t.Errorf("a file rewritten since the listing: %v, want a Changed error", err)
	}
}
