package volume

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"

	"github.com/cistern-csi/cistern/pkg/state"
)

// DefaultFSType is the filesystem of a mount volume that asks for none.
const DefaultFSType = "ext4"

// Format options: no discard, so mkfs does not punch holes into the image whose blocks
// CreateVolume reserved.
var formatOptions = map[string][]string{
	"ext4": {"-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1"},
	"xfs":  {"-K"},
}

// fsMountFlags are the mount options a filesystem always gets, after the caller's. XFS refuses a
// second filesystem with the UUID of one already mounted, and a clone or a restored snapshot is a
// copy of its source's blocks, UUID included: without nouuid, a volume and its clone cannot be
// mounted on one node at once (found by Kubernetes' storage e2e suite, "concurrently access the
// volume and its clone from pods on the same node").
var fsMountFlags = map[string][]string{
	"xfs": {"nouuid"},
}

// Volumes are mounted nodev,nosuid (docs/security.md, "Device nodes and set-user-ID files"): a
// pod may make device nodes in its volume (CAP_MKNOD is in the container runtimes' default set)
// and set-user-ID files, and a device node opened through a mount that allows it is the node's
// device (another volume's loop device), whatever the pod's device cgroup says. The staged
// filesystem, the overlay stacked on it and every publication get them; a raw block volume,
// which is a device node, does not. --volume-dev-suid lets both work again, node-wide, for the
// rare workload that needs them (DevSuid).
//
// The plugin's own mounts of a volume's filesystem (mountFilesystem: the write-back's mount
// aside, a resize's) are nodev,nosuid,noexec always: the plugin reads there and runs nothing.
const asideFlags = unix.MS_NODEV | unix.MS_NOSUID | unix.MS_NOEXEC

// volumeOptions are the mount options every volume mount gets before the caller's.
func (s *Service) volumeOptions() []string {
	if s.devSuid {
		return nil
	}
	return []string{"nodev", "nosuid"}
}

// volumeFlags are volumeOptions as mount(2) flags.
func (s *Service) volumeFlags() uintptr {
	if s.devSuid {
		return 0
	}
	return unix.MS_NODEV | unix.MS_NOSUID
}

// mountFilesystem mounts the filesystem of type fsType (DefaultFSType when empty) on dev at dir,
// with its own options (fsMountFlags) and asideFlags: a volume's filesystem mounted beside its
// staging or target path, for a tool or an upload that needs it there.
func mountFilesystem(dev, dir, fsType string, flags uintptr) error {
	if fsType == "" {
		fsType = DefaultFSType
	}
	return unix.Mount(dev, dir, fsType, flags|asideFlags, strings.Join(fsMountFlags[fsType], ","))
}

// sealAside makes a mount aside read-only with asideFlags, also one a plugin of an earlier
// version made (a bind remount sets the mount's flags to exactly those given).
func sealAside(dir string) error {
	return unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|asideFlags, "")
}

// withFSMountFlags returns flags with the filesystem's own options added when missing.
func withFSMountFlags(fs string, flags []string) []string {
	out := slices.Clone(flags)
	for _, f := range fsMountFlags[fs] {
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

// mountDevice formats the device if it has no filesystem yet, mounts it, and grows the
// filesystem when the image is larger (a volume restored from a smaller snapshot).
func (s *Service) mountDevice(dev, target string, v state.Volume, flags []string) error {
	if err := os.MkdirAll(target, 0o750); err != nil {
		return Internal("creating staging path", err)
	}
	notMnt, err := s.mounter.IsLikelyNotMountPoint(target)
	if err != nil {
		return Internal("checking staging path", err)
	}
	if !notMnt {
		src, _, err := mount.GetDeviceNameFromMount(s.mounter, target)
		if err != nil {
			return Internal("checking staging mount", err)
		}
		if src != dev {
			return status.Errorf(codes.FailedPrecondition, "staging path %s is a mount of %s, not of volume %s", target, src, v.ID)
		}
		return nil
	}
	fs := v.FSType
	if fs == "" {
		fs = DefaultFSType
	}
	flags = withFSMountFlags(fs, append(s.volumeOptions(), flags...))
	if !v.Formatted {
		// A fresh image of ours: no probe needed before mkfs.
		args := append(append([]string{}, formatOptions[fs]...), dev)
		if fs == "ext4" {
			args = append([]string{"-F", "-m0"}, args...)
		}
		if out, err := s.mounter.Exec.Command("mkfs."+fs, args...).CombinedOutput(); err != nil {
			return Internal("formatting volume", fmt.Errorf("mkfs.%s: %v: %s", fs, err, out))
		}
		if err := s.mounter.Mount(dev, target, fs, flags); err != nil {
			return Internal("mounting volume", err)
		}
		return nil
	}
	if err := s.mounter.FormatAndMountSensitiveWithFormatOptions(dev, target, fs, flags, nil, formatOptions[fs]); err != nil {
		return Internal("formatting and mounting volume", err)
	}
	if !v.NeedsGrow {
		return nil
	}
	if need, err := s.resizer.NeedResize(dev, target); err == nil && need {
		if _, err := s.resizer.Resize(dev, target); err != nil {
			if fs != "ext4" {
				return Internal("growing filesystem to the volume size", err)
			}
			// Online ext4 growth needs CAP_SYS_RESOURCE. Nothing uses this fresh mount yet, so
			// a plugin without it grows the filesystem offline instead.
			klog.InfoS("Online resize failed; growing offline", "device", dev, "err", err)
			if err := s.growExt4Offline(dev, target, flags); err != nil {
				return Internal("growing filesystem to the volume size", err)
			}
		}
	}
	return nil
}

// growExt4Offline unmounts, checks, grows and remounts an ext4 filesystem.
func (s *Service) growExt4Offline(dev, target string, flags []string) error {
	if err := s.mounter.Unmount(target); err != nil {
		return err
	}
	if out, err := s.mounter.Exec.Command("e2fsck", "-f", "-p", dev).CombinedOutput(); err != nil {
		// Exit status 1 means errors were corrected; anything above is a failure.
		var ee interface{ ExitStatus() int }
		if !errors.As(err, &ee) || ee.ExitStatus() > 1 {
			return fmt.Errorf("e2fsck %s: %v: %s", dev, err, out)
		}
	}
	if out, err := s.mounter.Exec.Command("resize2fs", dev).CombinedOutput(); err != nil {
		return fmt.Errorf("resize2fs %s: %v: %s", dev, err, out)
	}
	return s.mounter.Mount(dev, target, "ext4", flags)
}

// bindMount mounts source on target; a target that is already a mount point is left as it is.
func (s *Service) bindMount(source, target string, block, readOnly bool, flags []string) error {
	if block {
		if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
			return Internal("creating target parent", err)
		}
		f, err := os.OpenFile(target, os.O_CREATE, 0o640)
		if err != nil {
			return Internal("creating block target file", err)
		}
		f.Close()
	} else if err := os.MkdirAll(target, 0o750); err != nil {
		return Internal("creating target path", err)
	}
	notMnt, err := s.mounter.IsLikelyNotMountPoint(target)
	if err != nil {
		return Internal("checking target path", err)
	}
	if !notMnt {
		return nil
	}
	if !readOnly && len(flags) == 0 {
		// The common case: a bind mount(2), and the remount that applies volumeFlags (a bind
		// takes its source's, which a tree's pool may not have). mount-utils runs mount(8)
		// twice for a bind, which only read-only or flagged publications need.
		if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
			return Internal("bind-mounting volume", err)
		}
		if f := s.volumeFlags(); f != 0 && !block {
			if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|f, ""); err != nil {
				_ = unix.Unmount(target, 0)
				return Internal("making the volume's mount nodev,nosuid", err)
			}
		}
		return nil
	}
	opts := []string{"bind"}
	if !block {
		opts = append(opts, s.volumeOptions()...)
	}
	opts = append(opts, flags...)
	if readOnly {
		opts = append(opts, "ro")
	}
	if err := s.mounter.Mount(source, target, "", opts); err != nil {
		return Internal("bind-mounting volume", err)
	}
	return nil
}

// unmountTarget unmounts everything mounted at a directory or block-file target and removes
// it. It calls umount(2) directly — no mount table scan, no fork of umount(8) — and leaves
// anything unexpected (a busy or broken mount) to mount-utils.
func unmountTarget(m mount.Interface, target string) error {
	return unmountTargetSteps(m, target, nil)
}

// unmountTargetSteps is unmountTarget, timing each mount it peels ("umount1" the top one).
func unmountTargetSteps(m mount.Interface, target string, st *steps) error {
	fi, err := os.Lstat(target)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for n := 1; ; n++ {
		err := unix.Unmount(target, 0)
		if err == nil {
			st.done(fmt.Sprintf("umount%d", n))
			continue // mounts can be stacked
		}
		if errors.Is(err, unix.EINVAL) { // not a mount point (any more)
			break
		}
		if fi.IsDir() {
			return mount.CleanupMountPoint(target, m, true)
		}
		return fmt.Errorf("unmount %s: %w", target, err)
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
