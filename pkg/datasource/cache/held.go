package cache

// Versions held by descriptor. A streaming volume reads its version's directory for as long as
// it is served (the files the staging commits, the bytes it fetches itself), while names change
// under it: the version moves aside for another (Keep), is retired (Trim, or a staging that
// ended with volumes reading it), and another version is staged under the name it had. So a
// volume holds the directory itself: opened once, checked against the manifest digest its caller
// proved, every dataset file opened beneath it without following a link. Its reference file
// (refs/) moves with the directory, so eviction passes it by, and trimming or a staging that
// cannot go on retires it instead of deleting it or staging another version in it.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cistern-csi/cistern/pkg/datasource/dataset"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// StreamDir is where a streaming volume keeps the bytes it fetched on demand, inside its
// version's directory: stream/<RefName of the volume>.
const StreamDir = "stream"

// Held is a version directory held open by a volume.
type Held struct {
	f *os.File // O_PATH, O_DIRECTORY
	// Digest is the digest of the manifest read beneath the descriptor.
	Digest string
	// Objects is that manifest.
	Objects []source.Object
}

// openHeld opens dir and reads its manifest beneath the descriptor; digest, when set, is the
// version the caller proved, which the manifest must be.
func openHeld(dir, digest string) (*Held, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, source.Errorf(source.Retryable, "the dataset version is no longer on this pool; retry")
		}
		return nil, err
	}
	h := &Held{f: os.NewFile(uintptr(fd), dir)}
	if err := h.readManifest(); err != nil {
		h.Close()
		return nil, err
	}
	if digest != "" && h.Digest != digest {
		h.Close()
		return nil, source.Errorf(source.Retryable, "the dataset version checked is no longer there (another is staged in its place); retry")
	}
	return h, nil
}

// readManifest reads objects.jsonl beneath the descriptor and computes its digest.
func (h *Held) readManifest() error {
	f, err := h.Open(ObjectsFile)
	if err != nil {
		return err
	}
	defer f.Close()
	var d Digester
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var o source.Object
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			return fmt.Errorf("corrupt manifest line %d: %w", len(h.Objects)+1, err)
		}
		if err := d.Add(o); err != nil {
			return err
		}
		h.Objects = append(h.Objects, o)
	}
	if err := sc.Err(); err != nil {
		return err
	}
	h.Digest = d.Sum()
	return nil
}

// Path names the held directory wherever it is now (through /proc/self/fd), while it is held:
// for what opens by path (a proof reading the manifest, the streaming mount's scratch
// directory, which the mount then holds itself).
func (h *Held) Path() string { return "/proc/self/fd/" + strconv.Itoa(int(h.f.Fd())) }

// Open opens rel beneath the held directory read-only, refusing any link on the way (and a
// link at the end): a dataset's own symlinks never lead a read elsewhere.
func (h *Held) Open(rel string) (*os.File, error) {
	fd, err := unix.Openat2(int(h.f.Fd()), rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, &os.PathError{Op: "openat2", Path: rel, Err: err}
	}
	return os.NewFile(uintptr(fd), rel), nil
}

// Ready reports whether the held version is complete (its tree/ is published).
func (h *Held) Ready() bool {
	var st unix.Stat_t
	err := unix.Fstatat(int(h.f.Fd()), TreeDir, &st, unix.AT_SYMLINK_NOFOLLOW)
	return err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR
}

// Meta reads the held version's meta.json.
func (h *Held) Meta() (*Meta, error) { return ReadMeta(h.Path()) }

// Close lets the directory go; the reference stays (Unhold drops it).
func (h *Held) Close() { h.f.Close() }

// Is reports whether dir (a path) names the held directory now.
func (h *Held) Is(dir string) bool {
	var a, b unix.Stat_t
	if unix.Fstat(int(h.f.Fd()), &a) != nil || unix.Lstat(dir, &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// Hold references, for holder, the dataset version in dir (a staging under way, or a ready
// version) whose manifest has digest, the one the caller proved, and returns it held. The
// holder's reference on any other version of the dataset goes: a volume reads one version.
func (c *Cache) Hold(pool, dir, digest, holder string) (*Held, error) {
	pl := c.Lock(pool)
	pl.Lock()
	defer pl.Unlock()
	return c.holdLocked(pool, dir, digest, holder)
}

// HoldVersion is Hold of the ready version of spec's dataset with digest version, found where it
// is (current or kept).
func (c *Cache) HoldVersion(pool string, spec *dataset.Spec, version, holder string) (*Held, error) {
	pl := c.Lock(pool)
	pl.Lock()
	defer pl.Unlock()
	dir, err := versionDir(pool, spec, version)
	if err != nil {
		return nil, err
	}
	return c.holdLocked(pool, dir, version, holder)
}

// HoldReferenced holds the version of dataset id that holder references, wherever it is now
// (a process taking a streaming volume over finds what the earlier one served). NotFound when
// holder references none.
func (c *Cache) HoldReferenced(pool, id, holder string) (*Held, error) {
	pl := c.Lock(pool)
	pl.Lock()
	defer pl.Unlock()
	dir, err := referencing(pool, id, holder)
	if err != nil {
		return nil, err
	}
	return openHeld(dir, "")
}

func (c *Cache) holdLocked(pool, dir, digest, holder string) (*Held, error) {
	h, err := openHeld(dir, digest)
	if err != nil {
		return nil, err
	}
	refs := filepath.Join(h.Path(), RefsDir)
	if err = os.MkdirAll(refs, 0o755); err == nil {
		err = WriteFileSync(filepath.Join(refs, refName(holder)), []byte(holder))
	}
	if err != nil {
		h.Close()
		return nil, WriteErr(err)
	}
	for _, other := range versionDirs(pool, IDOf(filepath.Base(dir))) {
		if !h.Is(other) {
			c.dropRefLocked(pool, other, holder)
		}
	}
	Touch(h.Path())
	c.Changed()
	return h, nil
}

// dropRefLocked removes holder's reference (and scratch bytes) from the version in dir; a
// retired version goes with its last reference. The pool's lock is held.
func (c *Cache) dropRefLocked(pool, dir, holder string) {
	if err := os.Remove(filepath.Join(dir, RefsDir, refName(holder))); err != nil {
		return
	}
	_ = os.RemoveAll(filepath.Join(dir, StreamDir, refName(holder)))
	if name := filepath.Base(dir); strings.Contains(name, RetiredSep) && RefCount(dir) == 0 {
		_ = RemoveDataset(pool, name)
	}
}

// Unhold drops holder's reference on the held version and lets it go: a retired version goes
// with its last reference, as Release does.
func (c *Cache) Unhold(pool string, h *Held, holder string) error {
	pl := c.Lock(pool)
	pl.Lock()
	defer pl.Unlock()
	defer h.Close()
	defer c.Changed()
	if err := os.Remove(filepath.Join(h.Path(), RefsDir, refName(holder))); err != nil && !IsNotExist(err) {
		return err
	}
	// Where the version is now: only a retired one, unreferenced, is deleted.
	now, err := os.Readlink(h.Path())
	name := path.Base(now)
	if err != nil || !strings.Contains(name, RetiredSep) || !h.Is(DatasetDir(pool, name)) {
		Touch(h.Path())
		return nil
	}
	if RefCount(h.Path()) == 0 {
		return RemoveDataset(pool, name)
	}
	return nil
}

// Discard takes away the directory of a staging that cannot go on (abandoned, refused, or one
// staged beside the current version that ended): deleted, or retired while volumes reference it
// (streaming volumes read what it committed, held by descriptor). It is never left for another
// version to be staged in, nor deleted under its readers.
func (c *Cache) Discard(pool, dir string) error {
	pl := c.Lock(pool)
	pl.Lock()
	defer pl.Unlock()
	if _, err := os.Lstat(dir); IsNotExist(err) {
		return nil
	}
	defer c.Changed()
	return c.retireLocked(pool, filepath.Base(dir))
}
