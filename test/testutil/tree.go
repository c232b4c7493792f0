package testutil

import (
	"io/fs"
	"path/filepath"
)

// TreeSize counts the regular files under dir and their bytes: what a benchmark checks a copier
// left before it posts the copier's time.
func TreeSize(dir string) (files, bytes int64, err error) {
	err = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		files, bytes = files+1, bytes+info.Size()
		return nil
	})
	return files, bytes, err
}
