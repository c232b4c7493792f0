package cache

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"time"

	"github.com/cistern-csi/cistern/pkg/atomicfile"
	"github.com/cistern-csi/cistern/pkg/datasource/dataset"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// On-disk layout of a pool's cache, <pool>/.cistern-cache/<dataset-id>/:
//
//	meta.json      spec, totals and times; written before objects.jsonl is committed
//	objects.jsonl  the point-in-time manifest, one source.Object per line (committed by rename)
//	tmp/           files being downloaded, named by manifest line; cleared on every start
//	staging/       verified files at their final relative paths; invisible to volumes
//	tree/          staging/ renamed after one sync: the ready dataset, shared read-only
//	refs/          one file per volume using tree/ (bind mounts); eviction skips these
//	last-used      its mtime orders LRU eviction
const (
	CacheDirName = ".cistern-cache"
	MetaFile     = "meta.json"
	ObjectsFile  = "objects.jsonl"
	TmpDir       = "tmp"
	StagingDir   = "staging"
	TreeDir      = "tree"
	RefsDir      = "refs"
	LastUsedFile = "last-used"
	TrashPrefix  = ".trash-"
)

// Meta describes a dataset's manifest.
type Meta struct {
	Spec    *dataset.Spec `json:"spec"`
	Created time.Time     `json:"created"`
	Objects int64         `json:"objects"`
	Bytes   int64         `json:"bytes"`
	// Alloc estimates the space the files take in a filesystem (4 KiB blocks, one per directory).
	Alloc int64     `json:"alloc"`
	Ready time.Time `json:"ready,omitzero"`
	// Digest identifies the manifest's entries (manifest.go); empty in caches from before it.
	Digest string `json:"digest,omitempty"`
}

// TmpShards is how many directories tmp/ spreads its files over: one directory taking every
// create and rename is a point of contention with many small objects.
const TmpShards = 64

// TmpShard is the shard directory of manifest line i's temporary file, inside tmp/.
func TmpShard(i int64) string { return strconv.FormatInt(i%TmpShards, 10) }

// TmpBase is the name of manifest line i's temporary file in its shard.
func TmpBase(i int64) string { return strconv.FormatInt(i, 10) }

// TmpName is manifest line i's temporary file, relative to the dataset directory.
func TmpName(i int64) string { return path.Join(TmpDir, TmpShard(i), TmpBase(i)) }

// Dir is a pool's cache.
func Dir(pool string) string { return filepath.Join(pool, CacheDirName) }

// DatasetDir is one dataset's directory in a pool's cache.
func DatasetDir(pool, id string) string { return filepath.Join(Dir(pool), id) }

// IsReady reports whether the dataset in dir is complete (its tree/ is published).
func IsReady(dir string) bool { _, err := os.Stat(filepath.Join(dir, TreeDir)); return err == nil }

// AllocSize is size rounded up to 4 KiB blocks.
func AllocSize(size int64) int64 { return (size + 4095) &^ 4095 }

// EntryAlloc estimates what an entry takes in a filesystem: its blocks, and one block for every
// entry, empty files included (an inode and its share of a directory are not free).
func EntryAlloc(o source.Object) int64 { return AllocSize(o.Size) + 4096 }

// refName is the name of volumeID's reference file.
func refName(volumeID string) string {
	s := sha256.Sum256([]byte(volumeID))
	return hex.EncodeToString(s[:16])
}

// Touch marks the dataset in dir used now (LRU).
func Touch(dir string) { now := time.Now(); _ = os.Chtimes(filepath.Join(dir, LastUsedFile), now, now) }

// WriteFileSync writes b to path atomically (WriteAtomic).
func WriteFileSync(path string, b []byte) error {
	return WriteAtomic(path, func(f *os.File) error { _, err := f.Write(b); return err })
}

// WriteAtomic writes path through a temporary file, fsync and rename.
func WriteAtomic(path string, fill func(*os.File) error) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if err := fill(f); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir fsyncs a directory.
func SyncDir(dir string) error { return atomicfile.SyncDir(dir) }

// ReadMeta reads the meta.json of the dataset in dir.
func ReadMeta(dir string) (*Meta, error) {
	b, err := os.ReadFile(filepath.Join(dir, MetaFile))
	if err != nil {
		return nil, err
	}
	m := &Meta{}
	if err := json.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("corrupt %s: %w", MetaFile, err)
	}
	return m, nil
}

// WriteMeta writes the meta.json of the dataset in dir.
func WriteMeta(dir string, m *Meta) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return WriteFileSync(filepath.Join(dir, MetaFile), b)
}

// ManifestExists reports whether the listing was committed.
func ManifestExists(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, ObjectsFile))
	return err == nil
}

// EachObject streams the manifest; memory stays flat whatever the number of objects.
func EachObject(dir string, fn func(i int64, o source.Object) error) error {
	f, err := os.Open(filepath.Join(dir, ObjectsFile))
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var i int64
	for sc.Scan() {
		var o source.Object
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			return fmt.Errorf("corrupt manifest line %d: %w", i+1, err)
		}
		if err := fn(i, o); err != nil {
			return err
		}
		i++
	}
	return sc.Err()
}

// RefCount counts persisted volume references.
func RefCount(dir string) int {
	ents, err := os.ReadDir(filepath.Join(dir, RefsDir))
	if err != nil {
		return 0
	}
	return len(ents)
}

// LastUsed is when the dataset in dir was last used.
func LastUsed(dir string) time.Time {
	fi, err := os.Stat(filepath.Join(dir, LastUsedFile))
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

// IsNotExist reports a missing file.
func IsNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }

// RefName is the name volumeID's files take in a dataset directory (its reference file, its
// streaming scratch directory): a hash, so any ID makes a safe file name.
func RefName(volumeID string) string { return refName(volumeID) }
