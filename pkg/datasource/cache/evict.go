package cache

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/pkg/units"
)

// EvictEvent tells what was evicted and why.
type EvictEvent struct {
	Pool      string
	DatasetID string
	Source    string
	Bytes     int64
	LastUsed  time.Time
	Reason    string
}

func poolSpace(pool string) (free, size int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(pool, &st); err != nil {
		return 0, 0, err
	}
	return int64(st.Bavail) * st.Bsize, int64(st.Blocks) * st.Bsize, nil
}

// diskUsage sums the allocated blocks under dir.
func diskUsage(dir string) int64 {
	var total int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				total += st.Blocks * 512
			}
		}
		return nil
	})
	return total
}

// MakeRoom makes sure pool can take the rest of the dataset in dir (alloc bytes in all),
// evicting unused datasets if that would leave less than the low watermark free.
func (c *Cache) MakeRoom(ctx context.Context, pool, dir string, alloc int64) error {
	return c.Room(ctx, pool, max(alloc-diskUsage(filepath.Join(dir, StagingDir)), 0))
}

// Room makes sure pool can take need more bytes, evicting unused datasets if that would leave
// less than the low watermark free (what a streaming volume fetches on demand asks too).
func (c *Cache) Room(ctx context.Context, pool string, need int64) error {
	free, size, err := poolSpace(pool)
	if err != nil {
		return err
	}
	if free-need >= int64(c.cfg.LowWatermark*float64(size)) {
		return nil
	}
	c.Evict(ctx, pool, need)
	if free, _, err = poolSpace(pool); err != nil {
		return err
	}
	// Staging never takes the pool below its low watermark: the pool's volumes keep their room.
	if low := int64(c.cfg.LowWatermark * float64(size)); free-need < low {
		return source.Errorf(source.NoSpace, "pool %s has %s free, the dataset needs %s more and %s must stay free (--cache-low-watermark); no unused dataset is left to evict",
			pool, units.HumanBytes(free), units.HumanBytes(need), units.HumanBytes(low))
	}
	return nil
}

type candidate struct {
	// id is the dataset's, name its directory's (a version of id: kept ones are evicted alike).
	id, name string
	dir      string
	lastUsed time.Time
	bytes    int64
	source   string
}

// Evict deletes least-recently-used datasets that no volume uses and no staging holds, while
// free space is under the low watermark (or need more bytes are wanted), until the high
// watermark (plus need) is free.
func (c *Cache) Evict(ctx context.Context, pool string, need int64) {
	logger := klog.FromContext(ctx).WithValues("pool", pool)
	free, size, err := poolSpace(pool)
	if err != nil {
		logger.Error(err, "reading pool free space")
		return
	}
	low := int64(c.cfg.LowWatermark * float64(size))
	if free-need >= low {
		return
	}
	target := int64(c.cfg.HighWatermark*float64(size)) + need
	reason := fmt.Sprintf("pool free space %s is under the low watermark %s (%.0f%%)", units.HumanBytes(free), units.HumanBytes(low), 100*c.cfg.LowWatermark)
	if need > 0 && free >= low {
		reason = fmt.Sprintf("a dataset being staged needs %s and the pool has %s free", units.HumanBytes(need), units.HumanBytes(free))
	}

	pl := c.Lock(pool)
	pl.Lock()
	cands, err := c.candidates(pool)
	if err != nil {
		pl.Unlock()
		return
	}
	sort.Slice(cands, func(a, b int) bool { return cands[a].lastUsed.Before(cands[b].lastUsed) })
	if need > 0 {
		// Evicting cannot make room for a dataset that would not fit anyway: keep the cache.
		avail := free
		for _, v := range cands {
			avail += v.bytes
		}
		if avail < need {
			cands = nil
		}
	}
	var victims []candidate
	for _, v := range cands {
		if free >= target {
			break
		}
		trash := filepath.Join(Dir(pool), TrashPrefix+v.name)
		if err := os.Rename(v.dir, trash); err != nil {
			logger.Error(err, "evicting dataset", "datasetID", v.id, "version", v.name)
			continue
		}
		v.dir = trash
		victims = append(victims, v)
		free += v.bytes
	}
	pl.Unlock()
	if len(victims) > 0 {
		c.Changed()
	}

	for _, v := range victims {
		if err := os.RemoveAll(v.dir); err != nil {
			logger.Error(err, "deleting evicted dataset", "datasetID", v.id)
		}
		logger.Info("evicted cached dataset", "datasetID", v.id, "source", v.source, "bytes", v.bytes,
			"lastUsed", v.lastUsed, "reason", reason)
		if c.cfg.OnEvict != nil {
			c.cfg.OnEvict(EvictEvent{Pool: pool, DatasetID: v.id, Source: v.source, Bytes: v.bytes, LastUsed: v.lastUsed, Reason: reason})
		}
	}
}

// candidates lists the datasets of pool that no volume uses and no staging or copy pins, and
// deletes trash an earlier eviction left. The pool's lock is held.
func (c *Cache) candidates(pool string) ([]candidate, error) {
	ents, err := os.ReadDir(Dir(pool))
	if err != nil {
		return nil, err
	}
	var cands []candidate
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(Dir(pool), e.Name())
		if strings.HasPrefix(e.Name(), TrashPrefix) {
			_ = os.RemoveAll(dir) // left by a crash during an earlier eviction
			continue
		}
		if c.Busy(pool, e.Name()) || RefCount(dir) > 0 {
			continue
		}
		v := candidate{id: IDOf(e.Name()), name: e.Name(), dir: dir, lastUsed: LastUsed(dir), bytes: diskUsage(dir)}
		if md, err := ReadMeta(dir); err == nil && md.Spec != nil {
			v.source = md.Spec.Source
		}
		cands = append(cands, v)
	}
	return cands, nil
}
