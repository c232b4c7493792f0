// Package atomicfile replaces files so that a crash leaves the old content or the new, never a
// torn file: volume images, state records.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write fills a temporary file beside path, named with prefix (so that leftovers of a crash can
// be found and removed), syncs it and renames it over path. On failure the temporary file is
// removed. The directory is not synced: callers that need the rename durable sync it.
func Write(path, prefix string, fill func(*os.File) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), prefix)
	if err != nil {
		return err
	}
	tmp := f.Name()
	err = fill(f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// SyncDir syncs a directory, so that the renames and removals in it survive a crash.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
