package image

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Attach binds a loop device to the image at path and returns the device. If the image is
// already attached (a retried NodeStage, a restarted driver), the existing device is returned.
func Attach(path string) (string, error) {
	if dev, err := Find(path); err != nil || dev != "" {
		return dev, err
	}
	out, err := exec.Command("losetup", "--find", "--show", "--direct-io=on", path).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("losetup --find --show %s: %v: %s", path, err, strings.TrimSpace(string(out)))
	}
	// losetup prints warnings (for example when direct I/O is not possible) before the device.
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(lines[len(lines)-1]), nil
}

// Find returns the loop device backed by the image at path, or "" when there is none. It is on
// every stage, unstage and delete, so it lists bound devices from sysfs rather than running
// losetup. Devices are matched by the backing file's device and inode as the kernel holds them
// (LOOP_GET_STATUS64), not by name: the kernel reports the path it resolved (no symlinks, its
// own view of bind mounts), which need not be the path the driver attached, and a name match
// would leak a device on every stage and lose it across restarts.
func Find(path string) (string, error) {
	var want unix.Stat_t
	if err := unix.Stat(path, &want); err != nil {
		if os.IsNotExist(err) {
			return "", nil
		}
		return "", fmt.Errorf("stat %s: %w", path, err)
	}
	bound, err := filepath.Glob("/sys/block/loop*/loop")
	if err != nil {
		return "", err
	}
	name := filepath.Base(path)
	if resolved, err := filepath.EvalSymlinks(path); err == nil {
		name = filepath.Base(resolved)
	}
	for _, b := range bound {
		dev := "/dev/" + filepath.Base(filepath.Dir(b))
		if !mayBeBackedBy(b, name) {
			continue
		}
		info, err := loopStatus(dev)
		if err != nil {
			continue // detached meanwhile
		}
		if info.Device == want.Dev && info.Inode == want.Ino {
			return dev, nil
		}
	}
	return "", nil
}

// mayBeBackedBy says whether the loop device whose sysfs directory is dir may be backed by a
// file named name: its backing file's last path component, which the kernel's view of the
// directories above does not change. Only such a device is opened to compare the inode: an
// open of every bound device would hold, for that moment, devices of other volumes, whose
// detach (deferred while open) or exclusive open (mkfs, e2fsck, mount) could meet it.
func mayBeBackedBy(dir, name string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "backing_file"))
	if err != nil {
		return true // unknown: the inode decides
	}
	return filepath.Base(strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")) == name
}

func loopStatus(dev string) (*unix.LoopInfo64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return unix.IoctlLoopGetStatus64(int(f.Fd()))
}

// Detach releases a loop device. A device that is already free is not an error.
func Detach(dev string) error {
	if dev == "" {
		return nil
	}
	out, err := exec.Command("losetup", "--detach", dev).CombinedOutput()
	if err != nil {
		msg := string(out)
		if strings.Contains(msg, "No such device") || strings.Contains(msg, "No such device or address") {
			return nil
		}
		return fmt.Errorf("losetup --detach %s: %v: %s", dev, err, strings.TrimSpace(msg))
	}
	return nil
}

// RefreshSize makes the loop device pick up a grown image.
func RefreshSize(dev string) error {
	out, err := exec.Command("losetup", "--set-capacity", dev).CombinedOutput()
	if err != nil {
		return fmt.Errorf("losetup --set-capacity %s: %v: %s", dev, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// DeviceSize returns the size of a block device in bytes.
func DeviceSize(dev string) (int64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var size uint64
	if err := ioctlGetSize64(f.Fd(), &size); err != nil {
		return 0, fmt.Errorf("BLKGETSIZE64 %s: %w", dev, err)
	}
	return int64(size), nil
}

func ioctlGetSize64(fd uintptr, size *uint64) error {
	v, err := unix.IoctlGetUint64(int(fd), unix.BLKGETSIZE64)
	if err != nil {
		return err
	}
	*size = v
	return nil
}
