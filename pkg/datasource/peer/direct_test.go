package peer

import (
	"bytes"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// TestOpenPieceDirect: pieces of a large file are read by direct I/O where they start on a block,
// byte for byte what a buffered read gives, whatever the reader's buffers and the piece's end.
func TestOpenPieceDirect(t *testing.T) {
	dir := t.TempDir()
	size := int64(directMinSize + 3*directAlign + 1234)
	data := make([]byte, size)
	_, _ = rand.Read(data)
	if err := os.WriteFile(filepath.Join(dir, "entry"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	o := source.Object{Key: "entry", Size: size}
	for _, tc := range []struct {
		name   string
		off, n int64
		direct bool
	}{
		{"whole file", 0, size, true},
		{"a range inside", 1 << 20, 3 << 20, true},
		{"the last bytes, from a block", size &^ (directAlign - 1), size - size&^(directAlign-1), true},
		{"to the end", 2 << 20, size - 2<<20, true},
		{"one byte", 4096, 1, true},
		{"a range off the blocks", 100, 5000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, rd := range []struct {
				name string
				read func(io.Reader) ([]byte, error)
			}{
				{"server's buffers", func(r io.Reader) ([]byte, error) {
					var out bytes.Buffer
					buf := alignedBuf(copyChunk)
					for left := tc.n; left > 0; {
						k, err := io.ReadFull(r, buf[:min(int64(len(buf)), left)])
						out.Write(buf[:k])
						left -= int64(k)
						if err != nil {
							return out.Bytes(), err
						}
					}
					return out.Bytes(), nil
				}},
				{"small unaligned reads", func(r io.Reader) ([]byte, error) {
					var out bytes.Buffer
					buf := make([]byte, 4097)
					_, err := io.CopyBuffer(&out, struct{ io.Reader }{r}, buf[1:])
					return out.Bytes(), err
				}},
			} {
				rc, err := openPiece(dir, []string{"missing", "entry"}, o, tc.off, tc.n)
				if err != nil {
					t.Fatal(err)
				}
				_, isDirect := rc.(*directPiece)
				got, err := rd.read(rc)
				rc.Close()
				if err != nil {
					t.Fatalf("%s: %v", rd.name, err)
				}
				if !bytes.Equal(got, data[tc.off:tc.off+tc.n]) {
					t.Fatalf("%s: %d bytes differ from the file's [%d, %d)", rd.name, len(got), tc.off, tc.off+tc.n)
				}
				switch {
				case isDirect && !tc.direct:
					t.Errorf("%s: a piece off the blocks read with direct I/O", rd.name)
				case !isDirect && tc.direct:
					// A filesystem without direct I/O (tmpfs) reads buffered: not a failure.
					t.Logf("%s: read buffered, not with direct I/O", rd.name)
				}
			}
		})
	}
	// A piece past the end of the file is not held.
	if _, err := openPiece(dir, []string{"entry"}, o, size-10, 20); err != ErrNotHeld {
		t.Fatalf("a piece past the end: %v", err)
	}
}
