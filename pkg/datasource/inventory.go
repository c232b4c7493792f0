package datasource

// The inventory of a pool's cache: what the node holds, for the pool's StoragePool status
// (docs/storagepools.md). It is read from the cache directory and the running jobs without
// walking any dataset's files, so it costs a few syscalls per dataset; a generation that moves on
// every change lets the publisher re-read it only then.

import (
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
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
	Scheme Scheme
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
	// Bytes is what every dataset has staged (retired versions still in use included).
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

// InventoryGeneration returns the inventory generation and a channel closed when it next moves:
// a dataset starts, is listed, finishes, fails, is evicted, used or released, and every
// Config.ProgressInterval while one is being staged.
func (m *Manager) InventoryGeneration() (uint64, <-chan struct{}) { return m.changes.current() }

// changed records that an inventory would now read differently.
func (m *Manager) changed() { m.changes.bump() }

// Inventory reads what the cache of pool (a directory) holds, listing at most limit datasets
// (0: all). A pool without a cache holds nothing. It takes the pool's lock, as eviction and
// staging do when they add or remove a dataset, so it never sees one half-moved.
func (m *Manager) Inventory(pool string, limit int) (Inventory, error) {
	pl := m.poolLock(pool)
	pl.Lock()
	defer pl.Unlock()
	ents, err := os.ReadDir(cacheDir(pool))
	if err != nil && !isNotExist(err) {
		return Inventory{}, err
	}
	byID := map[string]*CachedDataset{}
	var retired []string
	for _, e := range ents {
		name := e.Name()
		switch {
		case !e.IsDir() || strings.HasPrefix(name, trashPrefix):
			continue
		case strings.Contains(name, retiredSep):
			retired = append(retired, name)
			continue
		}
		dir := datasetDir(pool, name)
		d := &CachedDataset{ID: name, LastUsed: lastUsed(dir), References: refCount(dir)}
		md, err := readMeta(dir)
		if err == nil && md.Spec != nil {
			d.describe(md.Spec)
			d.BytesTotal = md.Bytes
		}
		d.State = DatasetIncomplete
		if isReady(dir) && err == nil {
			d.State, d.BytesDone = DatasetReady, md.Bytes
		}
		byID[name] = d
	}

	m.mu.Lock()
	for key, j := range m.jobs {
		id, ok := strings.CutPrefix(key, pool+"\x00")
		if !ok {
			continue
		}
		d := byID[id]
		if d == nil {
			d = &CachedDataset{ID: id}
			byID[id] = d
		}
		d.describe(j.req.Spec)
		st := j.status()
		d.State, d.BytesDone, d.BytesTotal = DatasetStaging, st.BytesDone, st.BytesTotal
		d.LastUsed = laterOf(d.LastUsed, j.started)
	}
	for key, f := range m.lastFail {
		id, ok := strings.CutPrefix(key, pool+"\x00")
		if !ok {
			continue
		}
		d := byID[id]
		if d == nil {
			d = &CachedDataset{ID: id, State: DatasetIncomplete, LastUsed: f.at}
			d.describe(f.spec)
			byID[id] = d
		}
		// A job under way or a ready tree is what volumes get; a failure of someone's attempt
		// does not change that.
		if d.State == DatasetIncomplete {
			d.State, d.Reason = DatasetFailed, f.reason
		}
	}
	for key, n := range m.inUse {
		if id, ok := strings.CutPrefix(key, pool+"\x00"); ok && byID[id] != nil {
			byID[id].References += n
		}
	}
	m.mu.Unlock()

	inv := Inventory{}
	for _, name := range retired {
		dir := datasetDir(pool, name)
		if md, err := readMeta(dir); err == nil {
			inv.Bytes += md.Bytes
		}
		id, _, _ := strings.Cut(name, retiredSep)
		if d := byID[id]; d != nil {
			d.References += refCount(dir)
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
	return inv, nil
}

// describe fills what the inventory shows of a dataset's spec: a tenant's source is not shown.
func (d *CachedDataset) describe(s *Spec) {
	d.Scheme, d.Tenant, d.Source = s.Scheme, s.Tenant, ""
	if !s.Tenant {
		d.Source = s.Source
	}
}

func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// failureReason names the kind of a staging failure, for readers other than its caller.
func failureReason(err error) string {
	var se *source.Error
	if !errors.As(err, &se) {
		return "Error"
	}
	reason := map[source.Kind]string{
		source.Retryable: "Unavailable",
		source.Invalid:   "Invalid",
		source.Denied:    "Denied",
		source.NotFound:  "NotFound",
		source.Unsafe:    "Unsafe",
		source.Changed:   "Changed",
		source.TooLarge:  "TooLarge",
		source.Corrupt:   "Corrupt",
		source.NoSpace:   "NoSpace",
	}[se.Kind]
	if reason == "" {
		return "Error"
	}
	return reason
}

// failure is the last failed attempt at a dataset on a pool, as the inventory shows it: its
// kind only. The message stays the failing caller's (Manager.failed).
type failure struct {
	spec   *Spec
	reason string
	at     time.Time
}

// maxFailures bounds the failures remembered for the inventory; the oldest go first.
const maxFailures = 1024

// recordFailureLocked remembers, until the next attempt or maxFailures newer failures, that the
// attempt of job key failed. m.mu is held.
func (m *Manager) recordFailureLocked(key string, spec *Spec, err error, at time.Time) {
	if len(m.lastFail) >= maxFailures {
		oldest := ""
		for k, f := range m.lastFail {
			if oldest == "" || f.at.Before(m.lastFail[oldest].at) {
				oldest = k
			}
		}
		delete(m.lastFail, oldest)
	}
	m.lastFail[key] = failure{spec: spec, reason: failureReason(err), at: at}
}

// watchProgress marks the inventory changed every interval while a dataset is being staged,
// so that its published progress follows within one interval; at rest it marks nothing.
func (m *Manager) watchProgress(stop <-chan struct{}, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		m.mu.Lock()
		staging := len(m.jobs) > 0
		m.mu.Unlock()
		if staging {
			m.changed()
		}
	}
}
