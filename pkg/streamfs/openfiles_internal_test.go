package streamfs

import (
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestOpenFilesLRU: past the bound the least recently used idle file is closed, a file in use
// never is, and a closed one is opened again with its own bytes.
func TestOpenFilesLRU(t *testing.T) {
	dir := t.TempDir()
	o := NewOpenFiles(2)
	var hs []*handle
	for i := range 4 {
		path := filepath.Join(dir, strconv.Itoa(i))
		if err := os.WriteFile(path, []byte(strconv.Itoa(i)), 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, o.adopt(f, func() (*os.File, error) { return os.Open(path) }))
	}
	if o.Open() != 2 || hs[0].f != nil || hs[1].f != nil || o.Closed() != 2 {
		t.Fatalf("after 4 adopted under a bound of 2: %d open, closed %d, first two open: %v %v",
			o.Open(), o.Closed(), hs[0].f != nil, hs[1].f != nil)
	}
	read := func(h *handle, want string) {
		t.Helper()
		b := make([]byte, 1)
		if n, err := h.readAt(b, 0); err != nil || string(b[:n]) != want {
			t.Fatalf("read %q, %v; want %q", b[:n], err, want)
		}
	}
	// 2 was used before 3: reading 0 again closes 2.
	read(hs[0], "0")
	if hs[2].f != nil || hs[3].f == nil || hs[0].f == nil {
		t.Fatalf("reading 0 closed the wrong file: open 0 %v, 2 %v, 3 %v", hs[0].f != nil, hs[2].f != nil, hs[3].f != nil)
	}
	// Files in use are not closed: the bound is exceeded until they are released.
	f0, err := hs[0].acquire()
	if err != nil {
		t.Fatal(err)
	}
	f3, _ := hs[3].acquire()
	f1, _ := hs[1].acquire()
	if o.Open() != 3 || f0 == nil || f3 == nil || f1 == nil {
		t.Fatalf("3 in use: %d open", o.Open())
	}
	hs[1].release()
	if o.Open() != 2 || hs[1].f != nil {
		t.Fatalf("after a release over the bound: %d open, 1 open %v", o.Open(), hs[1].f != nil)
	}
	// A file whose mount goes while in use is closed at the end of the use, and not reopened.
	hs[0].close()
	if hs[0].f == nil {
		t.Fatal("closed while in use")
	}
	hs[0].release()
	hs[3].release()
	if hs[0].f != nil || o.Open() != 1 {
		t.Fatalf("after the last use of a closed file: %d open", o.Open())
	}
	if _, err := hs[0].readAt(make([]byte, 1), 0); err == nil {
		t.Fatal("a closed file was read")
	}
}

// TestBackingsUnderBound: registrations share the bound with descriptors; past it the least
// recently used idle one is dropped, never one an unreleased open holds nor one an earlier
// process made, and one whose connection ended is not dropped again.
func TestBackingsUnderBound(t *testing.T) {
	o := NewOpenFiles(2)
	var dropped []int32
	newB := func() *backing { return &backing{o: o, drop: func(id int32) { dropped = append(dropped, id) }} }
	b1, b2, b3 := newB(), newB(), newB()
	b1.adopt(1)
	b1.release()
	b2.adopt(2)
	b2.release()
	if id := b1.open(); id != 1 {
		t.Fatalf("b1 open: %d, want 1", id)
	}
	b1.release() // b2 is now the least recently used
	b3.adopt(3)
	if len(dropped) != 1 || dropped[0] != 2 || b2.open() != 0 || o.Open() != 2 {
		t.Fatalf("after a third under a bound of 2: dropped %v, %d open; want [2], 2", dropped, o.Open())
	}
	// b3 is open (unreleased): a fourth drops b1, then exceeds the bound until b3 is released.
	b4 := newB()
	b4.adopt(4)
	if len(dropped) != 2 || dropped[1] != 1 || o.Open() != 2 {
		t.Fatalf("dropped %v, %d open; want [2 1], 2", dropped, o.Open())
	}
	if b3.open() != 3 {
		t.Fatal("an open registration was dropped")
	}
	b5 := newB()
	b5.adopt(5)
	if o.Open() != 3 || len(dropped) != 2 {
		t.Fatalf("3 open ones: %d under the bound, dropped %v", o.Open(), dropped)
	}
	b3.release()
	if o.Open() != 3 {
		t.Fatalf("b3 still has an open: %d", o.Open())
	}
	b3.release()
	if o.Open() != 2 || len(dropped) != 3 || dropped[2] != 3 {
		t.Fatalf("after b3's last release over the bound: %d open, dropped %v", o.Open(), dropped)
	}
	// An earlier process's registration is never dropped; one whose connection ended is gone
	// without a drop.
	p := o.pin(9)
	b4.release()
	b5.release()
	if p.open() != 9 || o.Open() != 2 {
		t.Fatalf("pinned: %d open", o.Open())
	}
	p.release()
	if p.open() != 9 {
		t.Fatal("a pinned registration was dropped")
	}
	n := len(dropped)
	p.end()
	b5.end()
	b4.end()
	if len(dropped) != n || o.Open() != 0 || b5.open() != 0 {
		t.Fatalf("after the connection ended: dropped %v, %d open", dropped[n:], o.Open())
	}
}

// TestOpenLogResume: a process taking over reads what holds of each node: its last line, a
// dropped registration gone; once written again, the log says the same in fewer lines.
func TestOpenLogResume(t *testing.T) {
	dir, err := os.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dir.Close() })
	l, err := newOpenLog(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		id  uint64
		bid int32
	}{{2, 5}, {3, 0}, {2, -5}, {4, 7}, {2, 8}, {5, 9}, {5, -9}, {6, 0}, {6, 10}, {7, 11}, {7, -12}} {
		if err := l.record(r.id, r.bid); err != nil {
			t.Fatal(err)
		}
	}
	want := map[uint64]int32{2: 8, 3: 0, 4: 7, 6: 10, 7: 11}
	read := func() map[uint64]int32 {
		t.Helper()
		r, err := resumeOpenLog(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer r.close()
		return r.held
	}
	if got := read(); !maps.Equal(got, want) {
		t.Fatalf("resumed: %v, want %v", got, want)
	}
	l.mu.Lock()
	err = l.compactLocked()
	l.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if got := read(); !maps.Equal(got, want) || l.lines != len(want) {
		t.Fatalf("written again: %v (%d lines), want %v", got, l.lines, want)
	}
	// Records go on to the new file.
	if err := l.record(4, -7); err != nil {
		t.Fatal(err)
	}
	delete(want, 4)
	if got := read(); !maps.Equal(got, want) {
		t.Fatalf("after a drop: %v, want %v", got, want)
	}
	l.close()
}
