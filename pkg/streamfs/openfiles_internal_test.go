package streamfs

import (
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
