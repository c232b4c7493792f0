package cache

import (
	"os"
	"path/filepath"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// A writable volume layered on a cached dataset (an overlay whose lower layer is the tree) holds
// a reference on that version for its whole life, not only while it is mounted: the tree is part
// of the volume's data. The version may be retired meanwhile (a newer one staged in its place);
// the reference keeps it, under its retired name, until the last holder releases it. These two
// functions find that version again by its holder, so a later mount, a snapshot or a clone gets
// the very bytes the first caller proved it may read, never a newer version it did not.

// Referenced returns the tree of the version of dataset id on pool that holder references: the
// current one, a kept one or a retired one. NotFound when holder references none.
func (c *Cache) Referenced(pool, id, holder string) (string, error) {
	pl := c.Lock(pool)
	pl.Lock()
	defer pl.Unlock()
	dir, err := referencing(pool, id, holder)
	if err != nil {
		return "", err
	}
	Touch(dir)
	return filepath.Join(dir, TreeDir), nil
}

// Share adds a reference for to on the version of dataset id on pool that from references (a
// snapshot or clone of a layered volume takes its source's lower layer) and returns its tree.
// Idempotent.
func (c *Cache) Share(pool, id, from, to string) (string, error) {
	pl := c.Lock(pool)
	pl.Lock()
	defer pl.Unlock()
	dir, err := referencing(pool, id, from)
	if err != nil {
		return "", err
	}
	if err := WriteFileSync(filepath.Join(dir, RefsDir, refName(to)), []byte(to)); err != nil {
		return "", err
	}
	Touch(dir)
	c.Changed()
	return filepath.Join(dir, TreeDir), nil
}

// referencing returns the directory of the version of dataset id that holds holder's reference.
func referencing(pool, id, holder string) (string, error) {
	// A version moves aside when another is staged in its place, so a path recorded earlier may
	// name another version's tree.
	for _, dir := range versionDirs(pool, id) {
		if _, err := os.Stat(filepath.Join(dir, RefsDir, refName(holder))); err == nil {
			return dir, nil
		}
	}
	return "", source.Errorf(source.NotFound, "no cached version of dataset %s on pool %s is referenced by %s", id, pool, holder)
}

// versionDirs returns the directories of every version of dataset id on pool: the current one
// first, then the kept (VersionSep) and retired (RetiredSep) ones.
func versionDirs(pool, id string) []string {
	others, _ := filepath.Glob(DatasetDir(pool, id) + ".*")
	return append([]string{DatasetDir(pool, id)}, others...)
}
