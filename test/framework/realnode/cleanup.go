package realnode

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cistern-csi/cistern/test/testutil"
)

// MountsUnder lists the mount points at or below dir, deepest first.
func MountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountPath(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mounts = append(mounts, mp)
		}
	}
	sort.Slice(mounts, func(i, j int) bool { return strings.Count(mounts[i], "/") > strings.Count(mounts[j], "/") })
	return mounts
}

// mountinfo escapes spaces and a few other characters as octal.
func unescapeMountPath(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// LoopDevicesUnder is testutil.LoopDevicesUnder: each loop device whose backing file is below dir,
// with that file.
func LoopDevicesUnder(t *testing.T, dir string) map[string]string {
	t.Helper()
	return testutil.LoopDevicesUnder(dir)
}

// CleanupHost removes what a failed or interrupted run can leave on the host under dir: mounts
// (volume bind mounts in kubelet's pod directories, staging mounts, container root filesystems,
// the pool) and loop devices backed by files under dir. Runs after every process is stopped.
//
// Plain unmounts, deepest first, alternate with loop detaches: a pool stays busy while a loop
// device of a volume image in it is attached, and a lazy unmount would leave it (and its own loop
// device) alive out of sight. A lazy unmount is the last resort.
func CleanupHost(t *testing.T, dir string) {
	for range 3 {
		busy := false
		for _, mp := range MountsUnder(t, dir) {
			if err := unix.Unmount(mp, 0); err == unix.EBUSY {
				busy = true
			} else if err != nil && err != unix.EINVAL && err != unix.ENOENT {
				t.Logf("cleanup: unmounting %s: %v", mp, err)
			}
		}
		DetachLoops(t, dir)
		if !busy {
			return
		}
	}
	for _, mp := range MountsUnder(t, dir) {
		t.Logf("cleanup: %s is still busy; detaching it lazily", mp)
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			t.Logf("cleanup: unmounting %s: %v", mp, err)
		}
	}
	DetachLoops(t, dir)
}

// DetachLoops detaches the loop devices backed by files under dir.
func DetachLoops(t *testing.T, dir string) {
	for dev, backing := range LoopDevicesUnder(t, dir) {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Logf("cleanup: detaching %s (%s): %v: %s", dev, backing, err, out)
		}
	}
}

// CleanupCgroups removes the pod cgroups kubelet created (cgroupfs driver, cgroup v1: a
// "kubepods" tree in every hierarchy), deepest first; they are empty once the containers are gone.
func CleanupCgroups(t *testing.T) {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	for _, root := range roots {
		removeCgroupTree(t, root)
	}
}

// removeCgroupTree removes the cgroup root and those below it, deepest first.
func removeCgroupTree(t *testing.T, root string) {
	var dirs []string
	_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := unix.Rmdir(dirs[i]); err != nil && err != unix.ENOENT {
			t.Logf("cleanup: removing cgroup %s: %v", dirs[i], err)
		}
	}
}

// OwnCgroupRoot creates the cgroup /name in every cgroup v1 hierarchy for kubelet's --cgroup-root
// and removes it, deepest first, at the end (its pods' cgroups are empty once the containers are
// gone). It returns "/name".
func OwnCgroupRoot(t *testing.T, name string) string {
	t.Helper()
	hierarchies, _ := filepath.Glob("/sys/fs/cgroup/*/cgroup.procs")
	if len(hierarchies) == 0 {
		// cgroup v2: one hierarchy.
		hierarchies = []string{"/sys/fs/cgroup/cgroup.procs"}
	}
	var roots []string
	for _, h := range hierarchies {
		root := filepath.Join(filepath.Dir(h), name)
		if err := os.Mkdir(root, 0o755); err != nil && !os.IsExist(err) {
			t.Fatalf("creating cgroup %s: %v", root, err)
		}
		// A new cpuset cgroup has no CPUs or memory nodes until given its parent's.
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if v, err := os.ReadFile(filepath.Join(filepath.Dir(h), f)); err == nil {
				_ = os.WriteFile(filepath.Join(root, f), v, 0o644)
			}
		}
		roots = append(roots, root)
	}
	t.Cleanup(func() {
		for _, root := range roots {
			removeCgroupTree(t, root)
		}
	})
	return "/" + name
}
