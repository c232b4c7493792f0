package writeback

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// What the upload reads (docs/security.md, "Write-back: what the plugin reads"). The node plugin
// is root, and the pods may change any entry of their upper directory between the plan and the
// upload: a path opened by name follows a symlink in any component (to a root-only file of the
// node) and opens a device node (another volume's loop device). So every file is found beneath
// its tree (the upper directory, or the dataset's lower one, held by descriptor for the pass)
// with openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_XDEV, as O_PATH|O_NOFOLLOW (which
// opens no device and waits on no FIFO), and read only when that descriptor is the regular
// file the plan listed (device, inode, size, mtime). It is then opened for reading through
// /proc/self/fd (the same inode, whatever its name has become since), and its checksum and
// the bytes sent both come from that one descriptor.

// errNotPlanned is an entry that is no longer the regular file the plan listed: gone, a
// symlink, a device or another file in its place, written, or reached through a symlink.
var errNotPlanned = errors.New("no longer the regular file the plan listed")

// openat2 is unix.Openat2; tests replace it to play a kernel without it (before 5.6).
var openat2 = unix.Openat2

// tree is a directory whose files the upload reads, held by descriptor for one pass.
type tree struct {
	path string
	dir  *os.File // O_PATH|O_DIRECTORY
	// root is the fallback without openat2, made when first needed: os.Root resolves each
	// component beneath the root itself, and follows a symlink only to a path beneath it,
	// which the check of the descriptor then refuses unless it is the planned file anyway.
	root *os.Root
}

func openTree(p string) (*tree, error) {
	fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: p, Err: err}
	}
	return &tree{path: p, dir: os.NewFile(uintptr(fd), p)}, nil
}

func (t *tree) close() {
	if t == nil {
		return
	}
	_ = t.dir.Close()
	if t.root != nil {
		_ = t.root.Close()
	}
}

// entry opens rel beneath t as O_PATH, following no symlink; an entry that is not there, or
// not beneath t without one, is errNotPlanned.
func (t *tree) entry(rel string) (*os.File, error) {
	fd, err := openat2(int(t.dir.Fd()), rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err == nil {
		return os.NewFile(uintptr(fd), rel), nil
	}
	if !errors.Is(err, unix.ENOSYS) {
		return nil, notPlanned(rel, err)
	}
	if t.root == nil {
		if t.root, err = os.OpenRoot(t.path); err != nil {
			return nil, err
		}
	}
	f, err := t.root.OpenFile(rel, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, notPlanned(rel, err)
	}
	return f, nil
}

// notPlanned says which failures to find an entry mean the pods changed it (errNotPlanned):
// it went, a symlink or a mount point is on its way, or (os.Root's own error, not an errno)
// the way leaves the tree. EAGAIN: a rename under way while openat2 resolved it.
func notPlanned(rel string, err error) error {
	var errno unix.Errno
	if !errors.As(err, &errno) || errors.Is(err, fs.ErrNotExist) || errno == unix.ELOOP || errno == unix.EXDEV ||
		errno == unix.ENOTDIR || errno == unix.EAGAIN {
		return fmt.Errorf("%s: %w (%v)", rel, errNotPlanned, err)
	}
	return fmt.Errorf("%s: %w", rel, err)
}

// stat is what rel beneath t is: the plan's listing of an entry.
func (t *tree) stat(rel string) (unix.Stat_t, error) {
	var st unix.Stat_t
	p, err := t.entry(rel)
	if err != nil {
		return st, err
	}
	defer p.Close()
	err = unix.Fstat(int(p.Fd()), &st)
	return st, err
}

// open opens f, found at rel beneath t, for reading, when it is still the regular file the plan
// listed; else errNotPlanned.
func (t *tree) open(rel string, f file) (*os.File, error) {
	p, err := t.entry(rel)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	if err := f.is(p); err != nil {
		return nil, err
	}
	fh, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(p.Fd())), os.O_RDONLY|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: reopening for reading: %w", rel, err)
	}
	if err := f.is(fh); err != nil { // the same inode; checked on the descriptor read from
		_ = fh.Close()
		return nil, err
	}
	return fh, nil
}

// identity is what tells one file from another on the node: its device and inode.
type identity struct{ dev, ino uint64 }

func identityOf(st *unix.Stat_t) identity { return identity{dev: st.Dev, ino: st.Ino} }

// is checks that the file open at h is f as planned: regular, the same device and inode, size
// and mtime.
func (f file) is(h *os.File) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(h.Fd()), &st); err != nil {
		return fmt.Errorf("%s: %w", f.Path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || identityOf(&st) != f.id || st.Size != f.Size || st.Mtim.Nano() != f.MTime {
		return fmt.Errorf("%s: %w (mode %o, device %d, inode %d, %d bytes; planned device %d, inode %d, %d bytes)",
			f.Path, errNotPlanned, st.Mode, st.Dev, st.Ino, st.Size, f.id.dev, f.id.ino, f.Size)
	}
	return nil
}
