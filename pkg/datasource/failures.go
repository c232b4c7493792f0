package datasource

// Failed attempts as readers other than their caller see them: the kind of failure, in the
// inventory, never its message (Manager.failed keeps that for the failing caller).

import (
	"errors"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// The inventory's types live with the cache; these names keep the package's API.
type (
	DatasetState  = cache.DatasetState
	CachedDataset = cache.CachedDataset
	Inventory     = cache.Inventory
	EvictEvent    = cache.EvictEvent
)

const (
	// CacheDirName is the cache's directory in a pool: <pool>/.cistern-cache.
	CacheDirName = cache.CacheDirName

	DatasetStaging    = cache.DatasetStaging
	DatasetReady      = cache.DatasetReady
	DatasetFailed     = cache.DatasetFailed
	DatasetIncomplete = cache.DatasetIncomplete
)

// overlay adds to pool's datasets by ID the stagings under way and the failed attempts. The
// pool's lock is held (cache.Cache.Inventory).
func (m *Manager) overlay(pool string, byID map[string]*CachedDataset) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for key, js := range m.jobs {
		id, ok := strings.CutPrefix(key, pool+"\x00")
		if !ok {
			continue
		}
		d := byID[id]
		if d == nil {
			d = &CachedDataset{ID: id}
			byID[id] = d
		}
		d.Describe(js[0].Spec())
		st := stagingProgress(js)
		d.State, d.BytesDone, d.BytesTotal = DatasetStaging, st.BytesDone, st.BytesTotal
		for _, j := range js {
			d.LastUsed = cache.LaterOf(d.LastUsed, j.Started())
		}
	}
	for key, f := range m.lastFail {
		id, ok := strings.CutPrefix(key, pool+"\x00")
		if !ok {
			continue
		}
		d := byID[id]
		if d == nil {
			d = &CachedDataset{ID: id, State: DatasetIncomplete, LastUsed: f.at}
			d.Describe(f.spec)
			byID[id] = d
		}
		// A job under way or a ready tree is what volumes get; a failure of someone's attempt
		// does not change that.
		if d.State == DatasetIncomplete {
			d.State, d.Reason = DatasetFailed, f.reason
		}
	}
}

// failureReason names the kind of a staging failure, for readers other than its caller.
func failureReason(err error) string {
	var se *source.Error
	if !errors.As(err, &se) {
		return "Error"
	}
	reason := map[source.Kind]string{
		source.Retryable:    "Unavailable",
		source.Invalid:      "Invalid",
		source.Denied:       "Denied",
		source.NotFound:     "NotFound",
		source.Unsafe:       "Unsafe",
		source.Changed:      "Changed",
		source.TooLarge:     "TooLarge",
		source.Corrupt:      "Corrupt",
		source.NoSpace:      "NoSpace",
		source.Unverifiable: "Unverifiable",
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
	wait.Until(func() {
		m.mu.Lock()
		staging := len(m.jobs) > 0
		m.mu.Unlock()
		if staging {
			m.cache.Changed()
		}
	}, interval, stop)
}

// stagingProgress sums the progress of the stagings under way of one dataset (versions staged
// side by side).
func stagingProgress(js []*staging) Status {
	var st Status
	for _, j := range js {
		s := j.Status()
		st.BytesDone += s.BytesDone
		st.BytesTotal += s.BytesTotal
	}
	return st
}
