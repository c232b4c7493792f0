package cache

// Versions of one dataset side by side. Callers whose listings of a source differ (credentials
// that resolve the bucket to other data, a source that changed) each need the version they see.
// The dataset's directory <id>/ is where a version is staged and the current one; when a caller
// needs another, the current ready version moves aside to <id>.version-<digest>/ (its name is
// its listing's digest: keys, sizes, ETags) instead of being deleted, so that a caller who sees it
// again is served it without staging it again. Kept versions are ordinary cache entries: the
// least recently used unused ones go under the watermarks (evict.go) and past the administrator's
// limit of versions per dataset (Trim); a version in use is never deleted, only retired.

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource/dataset"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// VersionSep separates a dataset ID from the digest of a ready version kept beside the current
// one; RetiredSep from the suffix of a version that only its volumes still use; StagingSep from
// the suffix of a version being staged beside a staging under way in <id>/ (Beside).
const (
	VersionSep = ".version-"
	RetiredSep = ".retired-"
	StagingSep = ".staging-"
)

// Beside is a new directory's name for a version of dataset id staged on pool while another
// staging of it runs in <id>/ (one whose streaming volumes read it, say): once ready it becomes a
// kept version (Settle), and a failed one goes (Discard); it is never resumed.
func Beside(pool, id string) string {
	return DatasetDir(pool, id) + StagingSep + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// Settle makes the version staged in dir beside the current one (Beside), ready with digest, a
// kept version of its dataset; when that version is kept (or current) already, this copy goes
// instead (retired while volumes read it). Then at most maxVersions-1 versions stay kept.
func (c *Cache) Settle(pool, dir, digest string, maxVersions int) error {
	pl := c.Lock(pool)
	pl.Lock()
	defer pl.Unlock()
	defer c.Changed()
	id := IDOf(filepath.Base(dir))
	to := KeptDir(pool, id, digest)
	_, err := os.Stat(to)
	if err != nil && !IsNotExist(err) {
		return err
	}
	cur, ready := readyVersion(DatasetDir(pool, id))
	return c.keepAsLocked(pool, id, filepath.Base(dir), to, err == nil || ready && cur.Digest == digest, maxVersions)
}

// IDOf is the dataset ID of a cache directory's name (a current, kept or retired version).
func IDOf(name string) string { id, _, _ := strings.Cut(name, "."); return id }

// KeptDir is the directory of the version with digest of dataset id, kept on pool.
func KeptDir(pool, id, digest string) string { return DatasetDir(pool, id+VersionSep+digest) }

// Version is a ready version of a dataset on a pool.
type Version struct {
	// Dir is its directory: the dataset's own (current) or a kept one.
	Dir    string
	Meta   *Meta
	Digest string
}

// ReadyVersions lists the ready versions of dataset id on pool: the current one first, then the
// kept ones, most recently used first.
func ReadyVersions(pool, id string) []Version {
	var out []Version
	if v, ok := readyVersion(DatasetDir(pool, id)); ok {
		out = append(out, v)
	}
	kept, _ := filepath.Glob(DatasetDir(pool, id) + VersionSep + "*")
	slices.SortFunc(kept, func(a, b string) int { return LastUsed(b).Compare(LastUsed(a)) })
	for _, dir := range kept {
		if v, ok := readyVersion(dir); ok {
			out = append(out, v)
		}
	}
	return out
}

func readyVersion(dir string) (Version, bool) {
	if !IsReady(dir) {
		return Version{}, false
	}
	md, err := ReadMeta(dir)
	if err != nil {
		return Version{}, false
	}
	d, err := ManifestDigest(dir, md)
	if err != nil {
		return Version{}, false
	}
	return Version{Dir: dir, Meta: md, Digest: d}, true
}

// versionDir finds the ready version of spec's dataset on pool with the digest the caller proved
// it may read (empty: the current one).
func versionDir(pool string, spec *dataset.Spec, version string) (string, error) {
	dir := DatasetDir(pool, spec.ID())
	if version == "" {
		return dir, CheckVersion(dir, spec, version)
	}
	if IsReady(dir) && CheckVersion(dir, spec, version) == nil {
		return dir, nil
	}
	kept := KeptDir(pool, spec.ID(), version)
	if err := CheckVersion(kept, spec, version); err != nil {
		return "", source.Errorf(source.Retryable, "%s: the version checked is no longer on this pool; retry", spec.Describe())
	}
	return kept, nil
}

// Keep moves the current ready version of dataset id on pool aside, when it still has the given
// digest, so that another version can be staged in its place: volumes that use it keep it (their
// bind mounts follow the directory), and callers who prove they see it are served it from there.
// Then at most maxVersions-1 versions stay kept (Trim), leaving room for the one to be staged.
func (c *Cache) Keep(pool, id, digest string, maxVersions int) error {
	pl := c.Lock(pool)
	pl.Lock()
	defer pl.Unlock()
	dir := DatasetDir(pool, id)
	if c.Busy(pool, id) {
		return source.Errorf(source.Retryable, "the cached version is being copied into a volume; retry")
	}
	if !IsReady(dir) {
		return c.TrimLocked(pool, id, maxVersions-1) // replaced meanwhile, or only kept versions
	}
	md, err := ReadMeta(dir)
	if err != nil {
		return err
	}
	if d, err := ManifestDigest(dir, md); err != nil || d != digest {
		return err // replaced meanwhile
	}
	defer c.Changed()
	to := KeptDir(pool, id, digest)
	_, err = os.Stat(to)
	if err != nil && !IsNotExist(err) {
		return err
	}
	// The same version kept already: this copy goes with its volumes.
	return c.keepAsLocked(pool, id, id, to, err == nil, maxVersions)
}

// keepAsLocked makes the cache directory name (of dataset id, on pool) the kept version to,
// unless that version is kept (or current) already (have): then this copy is retired, for the
// volumes that read it. Then at most maxVersions-1 versions of id stay kept.
func (c *Cache) keepAsLocked(pool, id, name, to string, have bool, maxVersions int) error {
	if have {
		if err := c.retireLocked(pool, name); err != nil {
			return err
		}
	} else {
		if err := os.Rename(filepath.Join(Dir(pool), name), to); err != nil {
			return err
		}
		if err := SyncDir(Dir(pool)); err != nil {
			return err
		}
	}
	return c.TrimLocked(pool, id, maxVersions-1)
}

// TrimLocked leaves at most keep kept versions of dataset id on pool, deleting the least recently
// used beyond that: one in use is retired instead (deleted with its last reference), one being
// copied stays until the next trim. The pool's lock is held.
func (c *Cache) TrimLocked(pool, id string, keep int) error {
	kept, _ := filepath.Glob(DatasetDir(pool, id) + VersionSep + "*")
	if len(kept) <= keep {
		return nil
	}
	slices.SortFunc(kept, func(a, b string) int { return LastUsed(b).Compare(LastUsed(a)) })
	defer c.Changed()
	for _, dir := range kept[max(keep, 0):] {
		name := filepath.Base(dir)
		if c.Busy(pool, name) {
			continue
		}
		if err := c.retireLocked(pool, name); err != nil {
			return err
		}
	}
	return nil
}

// retireLocked deletes the version in cache directory name at once when nobody uses it, and
// otherwise renames it to a retired name that no caller is served and its last Release deletes.
func (c *Cache) retireLocked(pool, name string) error {
	dir := DatasetDir(pool, name)
	if RefCount(dir) == 0 {
		return RemoveDataset(pool, name)
	}
	to := DatasetDir(pool, IDOf(name)) + RetiredSep + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := os.Rename(dir, to); err != nil {
		return err
	}
	return SyncDir(Dir(pool))
}
