package peer

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

func TestMappedPiece(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 4<<20)
	_, _ = rand.Read(data)
	if err := os.WriteFile(filepath.Join(dir, "entry"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	o := source.Object{Size: int64(len(data))}
	for _, tc := range []struct {
		name   string
		off, n int64
		mapped bool
	}{
		{"a piece of 1 MiB and more is mapped, from a page boundary", 1 << 20, 2 << 20, true},
		{"a piece that starts inside a page is mapped", 1<<20 + 123, 2<<20 + 7, true},
		{"the last byte of the file", 1 << 20, 3 << 20, true},
		{"a small piece is read", 5, 1000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc, err := openPiece(dir, []string{"entry"}, o, tc.off, tc.n)
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			if _, ok := rc.(*mappedPiece); ok != tc.mapped {
				t.Fatalf("mapped %v, want %v", ok, tc.mapped)
			}
			got, err := io.ReadAll(rc)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data[tc.off:tc.off+tc.n]) {
				t.Fatalf("read %d bytes that differ from the file's [%d, +%d)", len(got), tc.off, tc.n)
			}
		})
	}
}

// A file cut short under a mapping faults (SIGBUS) when the missing pages are read: the read is
// an error, and the process goes on.
func TestMappedPieceCutShort(t *testing.T) {
	name := filepath.Join(t.TempDir(), "entry")
	if err := os.WriteFile(name, make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	rc, err := openPiece(filepath.Dir(name), []string{"entry"}, source.Object{Size: 4 << 20}, 1<<20, 2<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	m, ok := rc.(*mappedPiece)
	if !ok {
		t.Fatal("not mapped")
	}
	if err := os.Truncate(name, 0); err != nil {
		t.Fatal(err)
	}
	// The server's copy hands the pages to the connection: that write faults too.
	cert, _, err := SelfSigned("a")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(ServerConfig{Store: fileStore{name, 4 << 20}, Auth: anyNode{}, Self: "a", Cert: cert})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := srv.copy(context.Background(), &bytes.Buffer{}, m, 2<<20); err == nil {
		t.Fatalf("sent %d bytes of a file cut short under its mapping without an error", n)
	}
	if _, err := io.ReadAll(m); err == nil {
		t.Fatal("read a file cut short under its mapping without an error")
	}
}
