package testutil

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// RunOnScratchTmpfs runs a package's tests with TMPDIR on a tmpfs of the given size (mount
// option, e.g. "8g") when run as root, so that pools made with t.TempDir have room relative to
// their filesystem whatever the host disk holds: the dataset cache keeps a share of its pool's
// size free (--cache-low-watermark), and on a large, nearly full host disk that share alone would
// refuse every staging. Without root the tests run where they are.
func RunOnScratchTmpfs(m *testing.M, size string) int {
	if os.Geteuid() != 0 {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "cistern-scratch-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "scratch tmpfs:", err)
		return 1
	}
	defer os.Remove(dir)
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=1777"); err != nil {
		fmt.Fprintln(os.Stderr, "scratch tmpfs:", err)
		return 1
	}
	defer func() { _ = unix.Unmount(dir, unix.MNT_DETACH) }()
	old, had := os.LookupEnv("TMPDIR")
	os.Setenv("TMPDIR", dir)
	defer func() {
		if had {
			os.Setenv("TMPDIR", old)
		} else {
			os.Unsetenv("TMPDIR")
		}
	}()
	return m.Run()
}
