// Package testutil holds helpers that tests across the project share: real filesystems on loop
// devices, cleaned up when the test ends, also on failure.
package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cistern-csi/cistern/test/framework/kit"
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

// RequireFUSE is RequireRoot for a test that also mounts FUSE filesystems.
func RequireFUSE(t testing.TB) {
	t.Helper()
	RequireRoot(t)
	if _, err := os.Stat("/dev/fuse"); err != nil {
		Unavailable(t, "needs /dev/fuse: %v", err)
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
	FSImage(t, img, fsType, sizeBytes)
	LoopMount(t, img, mnt)
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

// FSImage makes img a sparse file of size bytes holding an empty filesystem of fsType (ext4 or
// xfs): the one way the suites, the node harness and hack/demo make a pool's filesystem. ext4 gets
// no reserved blocks, so that a pool's free space is what statfs reports to everyone.
func FSImage(t kit.TB, img, fsType string, size int64) {
	t.Helper()
	f, err := os.Create(img)
	if err == nil {
		err = f.Truncate(size)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Fatalf("filesystem image %s: %v", img, err)
	}
	mkfs := []string{"mkfs." + fsType}
	switch fsType {
	case "ext4":
		mkfs = append(mkfs, "-q", "-F", "-m0")
	case "xfs":
		mkfs = append(mkfs, "-q", "-f")
	}
	Run(t, append(mkfs, img)...)
}

// LoopMount mounts the filesystem image img at mnt (created if missing) through a loop device,
// which the kernel frees when it is unmounted (autoclear); the caller unmounts it.
func LoopMount(t kit.TB, img, mnt string) {
	t.Helper()
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	Run(t, "mount", "-o", "loop", img, mnt)
}

// Run runs a command and fails the test with its output when it fails.
func Run(t kit.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// LoopDevicesUnder maps each loop device whose backing file is below dir to that file, as sysfs
// shows it.
func LoopDevicesUnder(dir string) map[string]string {
	dir = filepath.Clean(dir)
	devs := map[string]string{}
	entries, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, e := range entries {
		data, err := os.ReadFile(e)
		if err != nil {
			continue // detached meanwhile
		}
		// A deleted backing file shows as "<path> (deleted)".
		backing := strings.TrimSuffix(strings.TrimSpace(string(data)), " (deleted)")
		if strings.HasPrefix(backing, dir+"/") {
			devs["/dev/"+filepath.Base(filepath.Dir(filepath.Dir(e)))] = backing
		}
	}
	return devs
}

// DetachLoopsUnder detaches every loop device whose backing file is below dir: a driver under
// test may leave some behind when the test fails midway.
func DetachLoopsUnder(dir string) {
	for dev := range LoopDevicesUnder(dir) {
		_ = exec.Command("losetup", "-d", dev).Run()
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
