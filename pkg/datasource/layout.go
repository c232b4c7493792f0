package datasource

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

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
	metaFile     = "meta.json"
	objectsFile  = "objects.jsonl"
	tmpDir       = "tmp"
	stagingDir   = "staging"
	treeDir      = "tree"
	refsDir      = "refs"
	lastUsedFile = "last-used"
	trashPrefix  = ".trash-"
)

// meta describes a dataset's manifest.
type meta struct {
	Spec    *Spec     `json:"spec"`
	Created time.Time `json:"created"`
	Objects int64     `json:"objects"`
	Bytes   int64     `json:"bytes"`
	// Alloc estimates the space the files take in a filesystem (4 KiB blocks, one per directory).
	Alloc int64     `json:"alloc"`
	Ready time.Time `json:"ready,omitzero"`
	// Digest identifies the manifest's entries (access.go); empty in caches from before it.
	Digest string `json:"digest,omitempty"`
}

func cacheDir(pool string) string       { return filepath.Join(pool, CacheDirName) }
func datasetDir(pool, id string) string { return filepath.Join(cacheDir(pool), id) }
func isReady(dir string) bool           { _, err := os.Stat(filepath.Join(dir, treeDir)); return err == nil }
func allocSize(size int64) int64        { return (size + 4095) &^ 4095 }

// entryAlloc estimates what an entry takes in a filesystem: its blocks, and one block for every
// entry, empty files included (an inode and its share of a directory are not free).
func entryAlloc(o source.Object) int64 { return allocSize(o.Size) + 4096 }

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
func refName(volumeID string) string {
	s := sha256.Sum256([]byte(volumeID))
	return hex.EncodeToString(s[:16])
}
func touch(dir string) { now := time.Now(); _ = os.Chtimes(filepath.Join(dir, lastUsedFile), now, now) }
func writeFileSync(path string, b []byte) error {
	return writeAtomic(path, func(f *os.File) error { _, err := f.Write(b); return err })
}

// writeAtomic writes path through a temporary file, fsync and rename.
func writeAtomic(path string, fill func(*os.File) error) error {
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
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func readMeta(dir string) (*meta, error) {
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		return nil, err
	}
	m := &meta{}
	if err := json.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("corrupt %s: %w", metaFile, err)
	}
	return m, nil
}

func writeMeta(dir string, m *meta) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return writeFileSync(filepath.Join(dir, metaFile), b)
}

// manifestExists reports whether the listing was committed.
func manifestExists(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, objectsFile))
	return err == nil
}

// eachObject streams the manifest; memory stays flat whatever the number of objects.
func eachObject(dir string, fn func(i int64, o source.Object) error) error {
	f, err := os.Open(filepath.Join(dir, objectsFile))
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

// refCount counts persisted volume references.
func refCount(dir string) int {
	ents, err := os.ReadDir(filepath.Join(dir, refsDir))
	if err != nil {
		return 0
	}
	return len(ents)
}

func lastUsed(dir string) time.Time {
	fi, err := os.Stat(filepath.Join(dir, lastUsedFile))
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
