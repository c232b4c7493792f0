package writeback

import (
	"testing"

	"golang.org/x/sys/unix"
)

// WithoutOpenat2 plays a kernel without openat2 (before 5.6) until t ends: entries are found
// through the os.Root fallback.
func WithoutOpenat2(t *testing.T) {
	openat2 = func(int, string, *unix.OpenHow) (int, error) { return -1, unix.ENOSYS }
	t.Cleanup(func() { openat2 = unix.Openat2 })
}
