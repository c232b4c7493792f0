package datasource

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

// makeRoom makes sure pool can take the rest of the dataset in dir (alloc bytes in all),
// evicting unused datasets if that would leave less than the low watermark free.
func (m *Manager) makeRoom(ctx context.Context, pool, dir string, alloc int64) error {
	need := max(alloc-diskUsage(filepath.Join(dir, stagingDir)), 0)
	free, size, err := poolSpace(pool)
	if err != nil {
		return err
	}
	if free-need >= int64(m.cfg.LowWatermark*float64(size)) {
		return nil
	}
	m.evictPool(ctx, pool, need)
	if free, _, err = poolSpace(pool); err != nil {
		return err
	}
	// Staging never takes the pool below its low watermark: the pool's volumes keep their room.
	if low := int64(m.cfg.LowWatermark * float64(size)); free-need < low {
		return source.Errorf(source.NoSpace, "pool %s has %s free, the dataset needs %s more and %s must stay free (--cache-low-watermark); no unused dataset is left to evict",
			pool, humanBytes(free), humanBytes(need), humanBytes(low))
	}
	return nil
}

type candidate struct {
	id       string
	dir      string
	lastUsed time.Time
	bytes    int64
	source   string
}

// evictPool deletes least-recently-used datasets that no volume uses and no staging holds, while
// free space is under the low watermark (or need more bytes are wanted), until the high
// watermark (plus need) is free.
func (m *Manager) evictPool(ctx context.Context, pool string, need int64) {
	logger := klog.FromContext(ctx).WithValues("pool", pool)
	free, size, err := poolSpace(pool)
	if err != nil {
		logger.Error(err, "reading pool free space")
		return
	}
	low := int64(m.cfg.LowWatermark * float64(size))
	if free-need >= low {
		return
	}
	target := int64(m.cfg.HighWatermark*float64(size)) + need
	reason := fmt.Sprintf("pool free space %s is under the low watermark %s (%.0f%%)", humanBytes(free), humanBytes(low), 100*m.cfg.LowWatermark)
	if need > 0 && free >= low {
		reason = fmt.Sprintf("a dataset being staged needs %s and the pool has %s free", humanBytes(need), humanBytes(free))
	}

	pl := m.poolLock(pool)
	pl.Lock()
	ents, err := os.ReadDir(cacheDir(pool))
	if err != nil {
		pl.Unlock()
		return
	}
	var cands []candidate
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(cacheDir(pool), e.Name())
		if strings.HasPrefix(e.Name(), trashPrefix) {
			_ = os.RemoveAll(dir) // left by a crash during an earlier eviction
			continue
		}
		if m.busy(pool, e.Name()) || refCount(dir) > 0 {
			continue
		}
		c := candidate{id: e.Name(), dir: dir, lastUsed: lastUsed(dir), bytes: diskUsage(dir)}
		if md, err := readMeta(dir); err == nil && md.Spec != nil {
			c.source = md.Spec.Source
		}
		cands = append(cands, c)
	}
	sort.Slice(cands, func(a, b int) bool { return cands[a].lastUsed.Before(cands[b].lastUsed) })
	if need > 0 {
		// Evicting cannot make room for a dataset that would not fit anyway: keep the cache.
		avail := free
		for _, c := range cands {
			avail += c.bytes
		}
		if avail < need {
			cands = nil
		}
	}
	var victims []candidate
	for _, c := range cands {
		if free >= target {
			break
		}
		trash := filepath.Join(cacheDir(pool), trashPrefix+c.id)
		if err := os.Rename(c.dir, trash); err != nil {
			logger.Error(err, "evicting dataset", "datasetID", c.id)
			continue
		}
		c.dir = trash
		victims = append(victims, c)
		free += c.bytes
	}
	pl.Unlock()
	if len(victims) > 0 {
		m.changed()
	}

	for _, c := range victims {
		if err := os.RemoveAll(c.dir); err != nil {
			logger.Error(err, "deleting evicted dataset", "datasetID", c.id)
		}
		logger.Info("evicted cached dataset", "datasetID", c.id, "source", c.source, "bytes", c.bytes,
			"lastUsed", c.lastUsed, "reason", reason)
		m.metrics.evictions.WithLabelValues(pool).Inc()
		m.metrics.evictedBytes.WithLabelValues(pool).Add(float64(c.bytes))
		if m.cfg.OnEvict != nil {
			m.cfg.OnEvict(EvictEvent{Pool: pool, DatasetID: c.id, Source: c.source, Bytes: c.bytes, LastUsed: c.lastUsed, Reason: reason})
		}
	}
}
