package bench

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"testing"
)

// TestIdentical: the per-server cases' check passes an exact copy and refuses one changed byte,
// a missing object and an extra file.
func TestIdentical(t *testing.T) {
	sh := shape{objects: 3, size: 4 << 10, key: func(i int) string { return filepath.Join("d", string(rune('a'+i))) }}
	want := expectedDigests(sh)
	write := func(t *testing.T) string {
		dir := t.TempDir()
		buf := make([]byte, sh.size)
		for i := range sh.objects {
			fill(buf, uint64(i))
			os.MkdirAll(filepath.Join(dir, "d"), 0o755)
			if err := os.WriteFile(filepath.Join(dir, sh.key(i)), buf, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	if err := identical(write(t), want); err != nil {
		t.Fatalf("exact copy: %v", err)
	}
	for name, spoil := range map[string]func(dir string) error{
		"changed byte": func(dir string) error {
			f, err := os.OpenFile(filepath.Join(dir, "d", "b"), os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteAt([]byte{0xff ^ firstByte(1)}, 0)
			return err
		},
		"missing object": func(dir string) error { return os.Remove(filepath.Join(dir, "d", "c")) },
		"extra file":     func(dir string) error { return os.WriteFile(filepath.Join(dir, "d", "z"), nil, 0o644) },
	} {
		t.Run(name, func(t *testing.T) {
			dir := write(t)
			if err := spoil(dir); err != nil {
				t.Fatal(err)
			}
			if err := identical(dir, want); err == nil {
				t.Fatal("accepted")
			}
		})
	}
	if len(want) != sh.objects || want["d/a"] == ([sha256.Size]byte{}) {
		t.Fatalf("digests: %v", want)
	}
}

// firstByte is the first byte upload writes for object i.
func firstByte(i int) byte {
	buf := make([]byte, 8)
	fill(buf, uint64(i))
	return buf[0]
}
