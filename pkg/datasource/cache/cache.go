// Package cache is a node's dataset cache in its pools: the on-disk layout of each dataset
// (layout.go), the manifest's rules and digest (manifest.go), the references volumes hold on a
// ready tree and the versions they pin (this file), eviction under the watermarks (evict.go),
// the inventory the StoragePool publisher reads (inventory.go) and the copy into a writable volume
// (populate.go). It stages nothing and proves nothing: the staging engine (package stage) fills
// it, and the coordinator (package datasource) hands its trees out only to callers that proved
// their access (package access).
package cache

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource/dataset"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// Config configures a Cache.
type Config struct {
	// LowWatermark and HighWatermark are fractions of a pool's size kept free: under Low, unused
	// cached datasets are evicted (least recently used first) until High is free again.
	LowWatermark, HighWatermark float64
	// OnEvict is told about every eviction, after the dataset is gone.
	OnEvict func(EvictEvent)
}

// Cache is the datasets cached in a node's pools. One per node; every method is safe for
// concurrent use. A pool's lock (Lock) is held by whatever adds a dataset to the pool or takes
// one away, so none of them ever sees a dataset half-moved.
type Cache struct {
	cfg Config

	mu    sync.Mutex
	pools map[string]*sync.Mutex // pool dir -> its lock
	// pins counts, per pool/id, the readers of a dataset's tree that hold no reference file (a
	// copy into a writable volume under way) and the stagings that fill it: eviction and
	// retirement leave a pinned dataset alone.
	pins map[string]*pins

	// changes moves whenever an Inventory would read differently (inventory.go).
	changes changes
}

type pins struct{ readers, stagers int }

// New returns an empty cache of pools.
func New(cfg Config, pools ...string) *Cache {
	c := &Cache{cfg: cfg, pools: map[string]*sync.Mutex{}, pins: map[string]*pins{}}
	for _, p := range pools {
		c.AddPool(p)
	}
	return c
}

func key(pool, id string) string { return pool + "\x00" + id }

// AddPool makes pool known: eviction and metrics cover it from now on.
func (c *Cache) AddPool(pool string) { c.Lock(pool) }

// Lock returns pool's lock, adding the pool on first use.
func (c *Cache) Lock(pool string) *sync.Mutex {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.pools[pool]
	if l == nil {
		l = &sync.Mutex{}
		c.pools[pool] = l
	}
	return l
}

// Pools lists the known pool directories.
func (c *Cache) Pools() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.pools))
	for p := range c.pools {
		out = append(out, p)
	}
	return out
}

// PinReader records a reader of the tree in cache directory id (a dataset ID, or a kept
// version's name) on pool that holds no reference file (a copy into a volume); the returned func
// drops it. Readers count as the dataset's references.
func (c *Cache) PinReader(pool, id string) (unpin func()) {
	return c.pin(pool, id, func(p *pins, d int) { p.readers += d })
}

// PinStaging records a staging of dataset id on pool; the returned func drops it.
func (c *Cache) PinStaging(pool, id string) (unpin func()) {
	return c.pin(pool, id, func(p *pins, d int) { p.stagers += d })
}

func (c *Cache) pin(pool, id string, add func(*pins, int)) func() {
	k := key(pool, id)
	c.mu.Lock()
	p := c.pins[k]
	if p == nil {
		p = &pins{}
		c.pins[k] = p
	}
	add(p, 1)
	c.mu.Unlock()
	c.Changed()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			if add(p, -1); p.readers == 0 && p.stagers == 0 {
				delete(c.pins, k)
			}
			c.mu.Unlock()
			c.Changed()
		})
	}
}

// Busy reports whether dataset id on pool is pinned: being staged or copied.
func (c *Cache) Busy(pool, id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pins[key(pool, id)] != nil
}

// readers returns the pinned readers of each dataset of pool.
func (c *Cache) readers(pool string) map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, p := range c.pins {
		if pl, id, _ := cutKey(k); pl == pool && p.readers > 0 {
			out[id] = p.readers
		}
	}
	return out
}

func cutKey(k string) (pool, id string, ok bool) {
	for i := 0; i < len(k); i++ {
		if k[i] == 0 {
			return k[:i], k[i+1:], true
		}
	}
	return "", "", false
}

// TreePath returns the ready dataset's tree on pool. It proves nothing of the caller.
func (c *Cache) TreePath(pool string, spec *dataset.Spec) (string, error) {
	dir := DatasetDir(pool, spec.ID())
	if !IsReady(dir) {
		return "", source.Errorf(source.NotFound, "%s is not staged on pool %s", spec.Describe(), pool)
	}
	return filepath.Join(dir, TreeDir), nil
}

// Acquire records that volumeID uses the dataset's tree on pool (a read-only bind mount) and
// returns the tree's path. version is the manifest digest the caller proved it may read (empty:
// the current one); it is found where it is, current or kept (versions.go), and one gone since is
// refused as changed, and the caller asks again. The reference is a file, so it survives driver
// restarts; Release removes it. Both are idempotent.
func (c *Cache) Acquire(pool string, spec *dataset.Spec, version, volumeID string) (string, error) {
	pl := c.Lock(pool)
	pl.Lock()
	defer pl.Unlock()
	dir, err := versionDir(pool, spec, version)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Join(dir, RefsDir), 0o755); err != nil {
		return "", err
	}
	Touch(dir)
	if err := WriteFileSync(filepath.Join(dir, RefsDir, refName(volumeID)), []byte(volumeID)); err != nil {
		return "", err
	}
	c.Changed()
	return filepath.Join(dir, TreeDir), nil
}

// CheckVersion says whether dir holds the ready dataset version the caller proved it may read.
func CheckVersion(dir string, spec *dataset.Spec, version string) error {
	if !IsReady(dir) {
		return source.Errorf(source.Retryable, "%s is not staged on this pool (any more); retry", spec.Describe())
	}
	if version == "" {
		return nil
	}
	md, err := ReadMeta(dir)
	if err != nil {
		return err
	}
	if d, err := ManifestDigest(dir, md); err != nil || d != version {
		return errors.Join(err, source.Errorf(source.Retryable, "%s was replaced by a newer version since it was checked; retry", spec.Describe()))
	}
	return nil
}

// RemoveDataset deletes a dataset directory: renamed to trash first, so a crash leaves nothing
// that looks like a dataset.
func RemoveDataset(pool, name string) error {
	trash := filepath.Join(Dir(pool), TrashPrefix+name)
	if err := os.Rename(DatasetDir(pool, name), trash); err != nil {
		return err
	}
	return RemoveAllQuick(trash)
}

// Release drops volumeID's reference to the dataset id on pool. The reference may be in a kept
// version, which stays cached, or a retired one, which goes with its last reference.
func (c *Cache) Release(pool, id, volumeID string) error {
	dir := DatasetDir(pool, id)
	err := os.Remove(filepath.Join(dir, RefsDir, refName(volumeID)))
	if err == nil || !IsNotExist(err) {
		if err == nil {
			_ = os.RemoveAll(filepath.Join(dir, StreamDir, refName(volumeID))) // a streaming volume's, left by an earlier process
		}
		Touch(dir)
		c.Changed()
		return err
	}
	for _, r := range versionDirs(pool, id)[1:] {
		err := os.Remove(filepath.Join(r, RefsDir, refName(volumeID)))
		if IsNotExist(err) {
			continue
		}
		if err != nil {
			return err
		}
		_ = os.RemoveAll(filepath.Join(r, StreamDir, refName(volumeID)))
		c.Changed()
		if !strings.Contains(filepath.Base(r), RetiredSep) {
			Touch(r)
			return nil
		}
		pl := c.Lock(pool)
		pl.Lock()
		defer pl.Unlock()
		if RefCount(r) == 0 {
			return RemoveDataset(pool, filepath.Base(r))
		}
		return nil
	}
	return nil
}

// RemoveAllQuick hides dir under a trash name first, so a half-deleted dataset is never mistaken
// for one to resume, then deletes it.
func RemoveAllQuick(dir string) error {
	trash := filepath.Join(filepath.Dir(dir), TrashPrefix+filepath.Base(dir)+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	if err := os.Rename(dir, trash); err != nil {
		if IsNotExist(err) {
			return nil
		}
		return err
	}
	return os.RemoveAll(trash)
}
