package stage

import (
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Staging many small files is bound by system calls. Through the dataset's os.Root, every create
// or rename walks its path from the root, one openat per component: for nested keys that costs
// more than the create itself. So the directories files are created in and renamed into are kept
// open, and a file is created or renamed with one system call on a single path component. That
// is as safe as the root: a single component cannot climb out (no slash, no ".."), creates use
// O_NOFOLLOW, and a rename replaces a final symlink rather than following it.

// maxOpenDirs bounds the directories one staging keeps open; beyond it, the root's path walk is
// used.
const maxOpenDirs = 1024

// dir is an open directory of the dataset (fd) or, past maxOpenDirs, only its path.
type dir struct {
	path string // relative to the dataset root, slash-separated
	f    *os.File
	fd   int
}

type dirCache struct {
	root *os.Root
	mu   sync.Mutex
	dirs map[string]*dir
	open int
}

func newDirCache(root *os.Root) *dirCache {
	return &dirCache{root: root, dirs: map[string]*dir{}}
}

// mkdir creates p and its parents, once, and returns it.
func (c *dirCache) mkdir(p string) (*dir, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, ok := c.dirs[p]; ok {
		return d, nil
	}
	if err := c.root.MkdirAll(p, 0o755); err != nil {
		return nil, conflictErr(p, err)
	}
	d := &dir{path: p, fd: -1}
	if c.open < maxOpenDirs {
		f, err := c.root.Open(p)
		if err != nil {
			return nil, err
		}
		d.f, d.fd = f, int(f.Fd())
		c.open++
	}
	c.dirs[p] = d
	return d, nil
}

// create creates (or truncates) the file name in d.
func (c *dirCache) create(d *dir, name string, flag int, mode os.FileMode) (*os.File, error) {
	if d.f == nil || strings.Contains(name, "/") {
		return c.root.OpenFile(d.path+"/"+name, flag|os.O_CREATE|os.O_TRUNC, mode)
	}
	fd, err := unix.Openat(d.fd, name, flag|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(mode.Perm()))
	if err != nil {
		return nil, &os.PathError{Op: "openat", Path: d.path + "/" + name, Err: err}
	}
	return os.NewFile(uintptr(fd), d.path+"/"+name), nil
}

// rename moves from/fromName to to/toName.
func (c *dirCache) rename(from *dir, fromName string, to *dir, toName string) error {
	if from.f == nil || to.f == nil || strings.Contains(fromName+toName, "/") {
		return c.root.Rename(from.path+"/"+fromName, to.path+"/"+toName)
	}
	if err := unix.Renameat(from.fd, fromName, to.fd, toName); err != nil {
		return &os.LinkError{Op: "renameat", Old: from.path + "/" + fromName, New: to.path + "/" + toName, Err: err}
	}
	return nil
}

// remove removes the file name from d.
func (c *dirCache) remove(d *dir, name string) error {
	if d.f == nil || strings.Contains(name, "/") {
		return c.root.Remove(d.path + "/" + name)
	}
	return unix.Unlinkat(d.fd, name, 0)
}

// close closes every open directory; the cache is not used afterwards.
func (c *dirCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range c.dirs {
		if d.f != nil {
			d.f.Close()
		}
	}
	c.dirs, c.open = map[string]*dir{}, 0
}
