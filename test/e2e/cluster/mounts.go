package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/mount-utils"

	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testutil"
)

// MakePool creates a filesystem of size bytes in an image file under dir and mounts it, through a
// loop device, at dir/<name>; it returns the mount point. At the end of the test everything
// mounted or attached under it is released, then the filesystem itself.
func MakePool(t framework.TB, dir, name string, size int64) string {
	t.Helper()
	img := filepath.Join(dir, name+".img")
	mnt := filepath.Join(dir, name)
	testutil.FSImage(t, img, "ext4", size)
	testutil.LoopMount(t, img, mnt)
	t.Cleanup(func() {
		if err := ReleaseUnder(mnt); err != nil {
			t.Logf("pool %s: %v", name, err)
		}
		if err := exec.Command("umount", mnt).Run(); err != nil {
			_ = exec.Command("umount", "-l", mnt).Run()
		}
		_ = os.Remove(img)
	})
	return mnt
}

// ReleaseUnder unmounts every mount point under dir (deepest first) and detaches every loop
// device whose backing file is under dir: what a driver that was killed, or a test that failed
// half-way, may have left. dir itself stays mounted.
func ReleaseUnder(dir string) error {
	dir = filepath.Clean(dir)
	var errs []string
	mps, err := mount.New("").List()
	if err != nil {
		return err
	}
	var under []string
	for _, mp := range mps {
		if strings.HasPrefix(mp.Path, dir+"/") {
			under = append(under, mp.Path)
		}
	}
	// Deepest first; a path mounted twice is unmounted twice.
	sort.Slice(under, func(i, j int) bool { return len(under[i]) > len(under[j]) })
	for _, p := range under {
		if out, err := exec.Command("umount", p).CombinedOutput(); err != nil {
			if out2, err2 := exec.Command("umount", "-l", p).CombinedOutput(); err2 != nil {
				errs = append(errs, fmt.Sprintf("umount %s: %s %s", p, out, out2))
			}
		}
	}
	for dev := range testutil.LoopDevicesUnder(dir) {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Sprintf("losetup -d %s: %s", dev, out))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("releasing %s: %s", dir, strings.Join(errs, "; "))
	}
	return nil
}
