// Package image manages the files that back Cistern volumes and snapshots inside a pool, and the
// loop devices that expose them. A volume is an image file whose blocks are reserved up front
// (fallocate): the pool's free space, as statfs reports it, is then the truth for placement, and a
// volume's own filesystem enforces its size with ENOSPC.
package image

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/cistern-csi/cistern/pkg/atomicfile"
)

const (
	volumesDir   = "volumes"
	snapshotsDir = "snapshots"
)

// VolumePath is where a volume's image lives inside its pool.
func VolumePath(poolPath, metaDir, id string) string {
	return filepath.Join(poolPath, metaDir, volumesDir, id+".img")
}

// SnapshotPath is where a snapshot's image lives inside its pool.
func SnapshotPath(poolPath, metaDir, id string) string {
	return filepath.Join(poolPath, metaDir, snapshotsDir, id+".img")
}

// Create makes an image of size bytes at path with its blocks reserved. It writes to a temporary
// name and renames, so a crash never leaves a short image under the final name.
func Create(path string, size int64) error {
	return build(path, func(f *os.File) error { return reserve(f, size) })
}

// CreateFrom makes an image at path holding a copy of src, grown to size bytes (size 0 keeps the
// copy as it is). The copy is a
// reflink where the filesystem supports it and a sparse copy otherwise.
func CreateFrom(path, src string, size int64) error {
	return build(path, func(f *os.File) error {
		in, err := os.Open(src)
		if err != nil {
			return err
		}
		defer in.Close()
		if err := copyImage(f, in); err != nil {
			return err
		}
		if size == 0 {
			return nil // a snapshot: keep the copy sparse
		}
		return reserve(f, size)
	})
}

// Grow extends the image at path to size bytes, reserving the new blocks. Shrinking is refused.
func Grow(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if size < fi.Size() {
		return fmt.Errorf("cannot shrink %s from %d to %d bytes", path, fi.Size(), size)
	}
	if err := reserve(f, size); err != nil {
		return err
	}
	return f.Sync()
}

// Size returns the image's size in bytes.
func Size(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// Remove deletes an image; a missing image is not an error.
func Remove(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// RemoveTemporary deletes images that a crash left half-built in the pool's image directories.
func RemoveTemporary(poolPath, metaDir string) error {
	var errs []error
	for _, sub := range []string{volumesDir, snapshotsDir} {
		matches, _ := filepath.Glob(filepath.Join(poolPath, metaDir, sub, ".tmp-*"))
		for _, m := range matches {
			errs = append(errs, Remove(m))
		}
	}
	return errors.Join(errs...)
}

func build(path string, fill func(*os.File) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(path, ".tmp-"+filepath.Base(path)+"-", fill)
}

// reserve grows f to size and allocates its blocks. Filesystems without fallocate get a sparse
// file: the volume still cannot outgrow its size, only the pool may be overcommitted.
func reserve(f *os.File, size int64) error {
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if err == nil {
		return nil
	}
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		return f.Truncate(size)
	}
	if errors.Is(err, unix.ENOSPC) {
		return fmt.Errorf("no space left in the pool for %d bytes: %w", size, err)
	}
	return fmt.Errorf("fallocate %d bytes: %w", size, err)
}

// copyImage copies in to out: a reflink when both are on a filesystem that shares extents
// (XFS with reflink, btrfs), otherwise only the data ranges, so holes stay holes.
func copyImage(out, in *os.File) error {
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err == nil {
		return nil
	}
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	if err := out.Truncate(size); err != nil {
		return err
	}
	var off int64
	for off < size {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if err != nil {
			if errors.Is(err, unix.ENXIO) {
				break // only a hole is left
			}
			return copyAll(out, in)
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return copyAll(out, in)
		}
		if err := copyRange(out, in, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

func copyRange(out, in *os.File, off, n int64) error {
	for n > 0 {
		roff, woff := off, off
		c, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(n), 0)
		if err != nil {
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) {
				_, err = io.Copy(io.NewOffsetWriter(out, off), io.NewSectionReader(in, off, n))
				return err
			}
			return err
		}
		if c == 0 {
			return io.ErrUnexpectedEOF
		}
		off += int64(c)
		n -= int64(c)
	}
	return nil
}

func copyAll(out, in *os.File) error {
	if _, err := in.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if _, err := out.Seek(0, io.SeekStart); err != nil {
		return err
	}
	_, err := io.Copy(out, in)
	return err
}
