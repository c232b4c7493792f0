package cache

// The inventory of a pool's cache: what the node holds, for the pool's StoragePool status
// (docs/storagepools.md). It is read from the cache directory (and, through the coordinator's
// overlay, the stagings under way) without
// walking any dataset's files, so it costs a few syscalls per dataset; a generation that moves on
// every change lets the publisher re-read it only then.

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource/dataset"
)

// DatasetState is the state of a dataset in a pool's cache.
type DatasetState string

const (
	// DatasetStaging is being listed or fetched.
	DatasetStaging DatasetState = "Staging"
	// DatasetReady is complete: volumes get it without a download.
	DatasetReady DatasetState = "Ready"
	// DatasetFailed is a dataset whose last attempt failed (Reason says the kind).
	DatasetFailed DatasetState = "Failed"
	// DatasetIncomplete is staged in part (an attempt ended early, or the driver restarted); it
	// resumes when a volume asks for it again.
	DatasetIncomplete DatasetState = "Incomplete"
)

// CachedDataset is one dataset of a pool's cache.
type CachedDataset struct {
	ID string
	// Source is the dataset's URL, which never holds credentials; empty for a dataset a tenant
	// named (Tenant): its bucket name is the tenant's, and the inventory is readable by whoever
	// may read StoragePools (docs/security.md).
	Source string
	Scheme dataset.Scheme
	Tenant bool
	State  DatasetState
	// Reason is the kind of a failure (Denied, NotFound, TooLarge, ...), never its message: the
	// message is told only to the caller whose attempt failed.
	Reason                string
	BytesDone, BytesTotal int64
	// LastUsed is when a volume last used the dataset, or its staging started.
	LastUsed time.Time
	// References counts the volumes bind-mounting the tree (all its versions) and the copies
	// into writable volumes under way.
	References int
}

// Inventory is what a pool's cache holds.
type Inventory struct {
	// Datasets are the most recently used datasets, most recent first, at most the number asked.
	Datasets []CachedDataset
	// Total, Ready, Staging and Failed count every dataset, listed or not.
	Total, Ready, Staging, Failed int
	// Bytes is what every dataset has staged (kept versions, and retired ones still in use,
	// included).
	Bytes int64
}

// changes is a generation that moves whenever an inventory would read differently, and a
// channel closed at each move.
type changes struct {
	mu  sync.Mutex
	gen uint64
	ch  chan struct{}
}

func (c *changes) bump() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	if c.ch != nil {
		close(c.ch)
		c.ch = nil
	}
}

func (c *changes) current() (uint64, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch == nil {
		c.ch = make(chan struct{})
	}
	return c.gen, c.ch
}

// Generation returns the inventory generation and a channel closed when it next moves: a
// dataset starts, is listed, finishes, fails, is evicted, used or released, and whenever the
// coordinator marks progress (Changed).
func (c *Cache) Generation() (uint64, <-chan struct{}) { return c.changes.current() }

// Changed records that an inventory would now read differently.
func (c *Cache) Changed() { c.changes.bump() }

// Inventory reads what the cache of pool (a directory) holds, listing at most limit datasets
// (0: all). A pool without a cache holds nothing. overlay, when set, adds what the coordinator
// knows and the disk does not (stagings under way, failed attempts) to the datasets by ID. It
// runs under the pool's lock, as eviction and staging hold it when they add or remove a dataset,
// so the inventory never sees one half-moved.
func (c *Cache) Inventory(pool string, limit int, overlay func(byID map[string]*CachedDataset)) (Inventory, error) {
	pl := c.Lock(pool)
	pl.Lock()
	defer pl.Unlock()
	byID, others, err := scan(pool)
	if err != nil {
		return Inventory{}, err
	}
	if overlay != nil {
		overlay(byID)
	}
	for id, n := range c.readers(pool) {
		if byID[id] != nil {
			byID[id].References += n
		}
	}
	return total(pool, byID, others, limit), nil
}

// scan reads the datasets of pool's cache directory, and names the other versions (kept and
// retired) of each.
func scan(pool string) (map[string]*CachedDataset, []string, error) {
	ents, err := os.ReadDir(Dir(pool))
	if err != nil && !IsNotExist(err) {
		return nil, nil, err
	}
	byID := map[string]*CachedDataset{}
	var others []string
	for _, e := range ents {
		name := e.Name()
		switch {
		case !e.IsDir() || strings.HasPrefix(name, TrashPrefix):
			continue
		case IDOf(name) != name:
			others = append(others, name)
			continue
		}
		dir := DatasetDir(pool, name)
		d := &CachedDataset{ID: name, LastUsed: LastUsed(dir), References: RefCount(dir)}
		md, err := ReadMeta(dir)
		if err == nil && md.Spec != nil {
			d.Describe(md.Spec)
			d.BytesTotal = md.Bytes
		}
		d.State = DatasetIncomplete
		if IsReady(dir) && err == nil {
			d.State, d.BytesDone = DatasetReady, md.Bytes
		}
		byID[name] = d
	}
	return byID, others, nil
}

// total counts the datasets and their other versions, and lists the most recently used limit. A
// dataset whose only ready version is a kept one is Ready.
func total(pool string, byID map[string]*CachedDataset, others []string, limit int) Inventory {
	inv := Inventory{}
	for _, name := range others {
		dir := DatasetDir(pool, name)
		md, err := ReadMeta(dir)
		if err == nil && IsReady(dir) { // a staging beside the current one, or retired before it was ready: not all there
			inv.Bytes += md.Bytes
		}
		id := IDOf(name)
		d := byID[id]
		kept := strings.Contains(name, VersionSep) && IsReady(dir) && err == nil && md.Spec != nil
		if d == nil && kept {
			d = &CachedDataset{ID: id, State: DatasetReady, BytesDone: md.Bytes, BytesTotal: md.Bytes}
			d.Describe(md.Spec)
			inv.Bytes -= md.Bytes // counted below as the dataset's
			byID[id] = d
		}
		if d != nil {
			d.References += RefCount(dir)
			d.LastUsed = LaterOf(d.LastUsed, LastUsed(dir))
		}
	}
	for _, d := range byID {
		inv.Total++
		inv.Bytes += d.BytesDone
		switch d.State {
		case DatasetReady:
			inv.Ready++
		case DatasetStaging:
			inv.Staging++
		case DatasetFailed:
			inv.Failed++
		}
		inv.Datasets = append(inv.Datasets, *d)
	}
	slices.SortFunc(inv.Datasets, func(a, b CachedDataset) int {
		if c := b.LastUsed.Compare(a.LastUsed); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	if limit > 0 && len(inv.Datasets) > limit {
		inv.Datasets = inv.Datasets[:limit]
	}
	return inv
}

// Describe fills what the inventory shows of a dataset's spec: a tenant's source is not shown.
func (d *CachedDataset) Describe(s *dataset.Spec) {
	d.Scheme, d.Tenant, d.Source = s.Scheme, s.Tenant, ""
	if !s.Tenant {
		d.Source = s.Source
	}
}

// LaterOf is the later of two times.
func LaterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// ReadyTotals sums the ready datasets of pool's cache: their bytes (every version's), and how
// many datasets there are.
func ReadyTotals(pool string) (bytes int64, n int) {
	ents, _ := os.ReadDir(Dir(pool))
	ids := map[string]bool{}
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), TrashPrefix) {
			continue
		}
		dir := filepath.Join(Dir(pool), e.Name())
		if md, err := ReadMeta(dir); err == nil && IsReady(dir) {
			bytes += md.Bytes
			ids[IDOf(e.Name())] = true
		}
	}
	return bytes, len(ids)
}
