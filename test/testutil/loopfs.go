// Package testutil holds helpers that tests across the project share: real filesystems on loop
// devices, cleaned up when the test ends, also on failure.
package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// RequireRoot skips a test that needs mounts and loop devices when not run as root (fails it
// under CI, see Unavailable).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "needs root for loop devices and mounts")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		Unavailable(t, "needs loop devices: %v", err)
	}
}

// LoopFS creates a filesystem of the given type and size in a sparse image, mounts it on a
// temporary directory and returns the mount point. Unmount, loop detach and removal happen in
// t.Cleanup.
func LoopFS(t testing.TB, fsType string, sizeBytes int64) string {
	t.Helper()
	RequireRoot(t)
	dir := t.TempDir()
	img := filepath.Join(dir, "pool.img")
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(sizeBytes); err != nil {
		t.Fatal(err)
	}
	f.Close()
	mkfs := []string{"mkfs." + fsType}
	switch fsType {
	case "ext4":
		mkfs = append(mkfs, "-q", "-F", "-m0")
	case "xfs":
		mkfs = append(mkfs, "-q", "-f")
	}
	Run(t, append(mkfs, img)...)
	Run(t, "mount", "-o", "loop", img, mnt)
	t.Cleanup(func() {
		// Lazy unmount: a failed test may leave mounts below; they go with it.
		_ = exec.Command("umount", "-R", "-l", mnt).Run()
		if out, _ := exec.Command("losetup", "-j", img).Output(); len(out) > 0 {
			dev := strings.SplitN(string(out), ":", 2)[0]
			_ = exec.Command("losetup", "-d", dev).Run()
		}
	})
	return mnt
}

// Run runs a command and fails the test with its output when it fails.
func Run(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// DetachLoopsUnder detaches every loop device whose backing file is below dir: a driver under
// test may leave some behind when the test fails midway.
func DetachLoopsUnder(dir string) {
	out, err := exec.Command("losetup", "--noheadings", "--output", "NAME,BACK-FILE", "--list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && strings.HasPrefix(f[1], dir+"/") {
			_ = exec.Command("losetup", "-d", f[0]).Run()
		}
	}
}

// UnmountUnder lazily unmounts every mount point below dir, deepest first.
func UnmountUnder(dir string) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var targets []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			targets = append(targets, f[4])
		}
	}
	for i := len(targets) - 1; i >= 0; i-- {
		_ = exec.Command("umount", "-l", targets[i]).Run()
	}
}

// RunAllowFail runs a command and returns its output and error without failing the test.
func RunAllowFail(args ...string) (string, error) {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	return string(out), err
}
