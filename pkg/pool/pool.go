package pool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// MetaDir is the directory inside each pool where the driver keeps volume and snapshot images
// (pkg/image). The dataset cache is its sibling, <pool>/.cistern-cache (pkg/datasource).
const MetaDir = ".cistern"

// DefaultMaxErrors bounds the per-pool error history.
const DefaultMaxErrors = 10

// Error is one reported pool problem, as the StoragePool KEP's status.errors entry.
type Error struct {
	Time    time.Time
	Message string
}

// Status is a pool as last checked.
type Status struct {
	Spec
	TotalBytes     int64
	AvailableBytes int64
	Healthy        bool
	// Message says why the pool is unhealthy; empty when healthy.
	Message string
	// Errors holds recent problems, oldest first, at most DefaultMaxErrors.
	Errors    []Error
	CheckedAt time.Time
}

// Manager tracks the configured pools and their health. Reads are cheap snapshots; Refresh does
// the filesystem checks. Every change a StoragePool reader would care about bumps Generation.
type Manager struct {
	mu         sync.RWMutex
	pools      map[string]*Status
	devices    map[string]uint64 // pool name -> st_dev seen at the first healthy check
	generation uint64
	changed    chan struct{} // closed and replaced at each generation bump
	checked    bool
	now        func() time.Time
}

// NewManager builds a manager for cfg. Call Refresh (or Run) before relying on health.
func NewManager(cfg *Config) *Manager {
	m := &Manager{
		pools:   map[string]*Status{},
		devices: map[string]uint64{},
		changed: make(chan struct{}),
		now:     time.Now,
	}
	m.setConfigLocked(cfg)
	return m
}

// SetConfig replaces the pool list. Pools that keep their name keep their history.
func (m *Manager) SetConfig(cfg *Config) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.setConfigLocked(cfg) {
		m.bumpLocked()
	}
}

func (m *Manager) setConfigLocked(cfg *Config) bool {
	changed := false
	next := map[string]*Status{}
	for _, spec := range cfg.Pools {
		old, ok := m.pools[spec.Name]
		if ok && old.Path == spec.Path {
			cp := *old
			if !equalLabels(cp.Labels, spec.Labels) || cp.Shared != spec.Shared {
				changed = true
			}
			cp.Spec = spec
			next[spec.Name] = &cp
			continue
		}
		changed = true
		delete(m.devices, spec.Name)
		next[spec.Name] = &Status{Spec: spec, Message: "not checked yet"}
	}
	if len(next) != len(m.pools) {
		changed = true
	}
	m.pools = next
	return changed
}

// Generation changes whenever the reported pool set changes.
func (m *Manager) Generation() uint64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.generation
}

// Changed returns a channel that is closed at the next generation bump.
func (m *Manager) Changed() <-chan struct{} {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.changed
}

// Checked reports whether every pool has been checked at least once.
func (m *Manager) Checked() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.checked
}

// List returns a copy of all pools sorted by name, and the generation they belong to.
func (m *Manager) List() ([]Status, uint64) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]Status, 0, len(m.pools))
	for _, p := range m.pools {
		out = append(out, p.copy())
	}
	sortStatuses(out)
	return out, m.generation
}

// Get returns one pool by name.
func (m *Manager) Get(name string) (Status, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	p, ok := m.pools[name]
	if !ok {
		return Status{}, false
	}
	return p.copy(), true
}

// PoolPath returns a configured pool's directory: pkg/datasource resolves pool names through it.
func (m *Manager) PoolPath(name string) (string, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	p, ok := m.pools[name]
	if !ok {
		return "", false
	}
	return p.Path, true
}

// RecordError adds a problem seen outside the health check (for example an I/O error while
// creating a volume) to the pool's history.
func (m *Manager) RecordError(name, message string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.pools[name]; ok {
		p.addError(Error{Time: m.now(), Message: message})
		m.bumpLocked()
	}
}

// Run refreshes the pools every interval until stop is closed.
func (m *Manager) Run(stop <-chan struct{}, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			m.Refresh()
		}
	}
}

// UpdateCapacity re-reads one pool's free space (statfs only); volume operations call it so
// that placement sees their effect without a full health check.
func (m *Manager) UpdateCapacity(name string) {
	m.mu.RLock()
	p, ok := m.pools[name]
	var path string
	if ok {
		path = p.Path
	}
	m.mu.RUnlock()
	if !ok {
		return
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return // the next health check reports it
	}
	total, avail := int64(st.Blocks)*int64(st.Bsize), int64(st.Bavail)*int64(st.Bsize)
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok = m.pools[name]
	if !ok || !p.Healthy {
		return
	}
	bump := total != p.TotalBytes || significant(p.AvailableBytes, avail, total)
	p.TotalBytes, p.AvailableBytes = total, avail
	if bump {
		m.bumpLocked()
	}
}

// Refresh checks every pool: path, filesystem, writability and free space.
func (m *Manager) Refresh() {
	m.mu.RLock()
	specs := make([]Spec, 0, len(m.pools))
	for _, p := range m.pools {
		specs = append(specs, p.Spec)
	}
	m.mu.RUnlock()

	results := make(map[string]checkResult, len(specs))
	for _, s := range specs {
		results[s.Name] = check(s)
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	bump := !m.checked
	m.checked = true
	for name, r := range results {
		p, ok := m.pools[name]
		if !ok {
			continue // removed while we were checking
		}
		if r.err == nil {
			if dev, seen := m.devices[name]; !seen {
				m.devices[name] = r.dev
			} else if dev != r.dev {
				r.err = fmt.Errorf("the filesystem at %s changed (device %d, was %d): is the pool still mounted?", p.Path, r.dev, dev)
			}
		}
		if m.applyLocked(p, r) {
			bump = true
		}
	}
	if bump {
		m.bumpLocked()
	}
}

// applyLocked stores a check result and says whether a reader would see a difference.
func (m *Manager) applyLocked(p *Status, r checkResult) bool {
	changed := false
	wasHealthy, oldMsg := p.Healthy, p.Message
	p.CheckedAt = m.now()
	if r.err != nil {
		p.Healthy, p.Message = false, r.err.Error()
	} else {
		p.Healthy, p.Message = true, ""
	}
	if p.Healthy != wasHealthy || p.Message != oldMsg {
		changed = true
		if !p.Healthy {
			p.addError(Error{Time: p.CheckedAt, Message: p.Message})
			klog.InfoS("Pool is unhealthy", "pool", p.Name, "path", p.Path, "reason", p.Message)
		} else if oldMsg != "not checked yet" {
			klog.InfoS("Pool is healthy again", "pool", p.Name, "path", p.Path)
		}
	}
	if r.total != p.TotalBytes || significant(p.AvailableBytes, r.available, r.total) {
		changed = true
	}
	if r.statOK {
		p.TotalBytes, p.AvailableBytes = r.total, r.available
	} else {
		p.TotalBytes, p.AvailableBytes = 0, 0
	}
	return changed
}

// significant says whether a change of available bytes is worth telling watchers about: more
// than 0.1% of the pool (at least 1 MiB). Exact values are still returned on every list.
func significant(old, cur, total int64) bool {
	d := old - cur
	if d < 0 {
		d = -d
	}
	g := total / 1000
	if g < 1<<20 {
		g = 1 << 20
	}
	return d >= g
}

func (m *Manager) bumpLocked() {
	m.generation++
	close(m.changed)
	m.changed = make(chan struct{})
}

func (p *Status) addError(e Error) {
	p.Errors = append(p.Errors, e)
	if n := len(p.Errors) - DefaultMaxErrors; n > 0 {
		p.Errors = append([]Error(nil), p.Errors[n:]...)
	}
}

func (p *Status) copy() Status {
	cp := *p
	cp.Errors = append([]Error(nil), p.Errors...)
	if p.Labels != nil {
		cp.Labels = make(map[string]string, len(p.Labels))
		for k, v := range p.Labels {
			cp.Labels[k] = v
		}
	}
	return cp
}

type checkResult struct {
	statOK           bool
	total, available int64
	dev              uint64
	err              error
}

// minFree is the free space under which a pool counts as full: 1% of it, between 1 MiB and 1 GiB.
func minFree(total int64) int64 {
	f := total / 100
	if f < 1<<20 {
		f = 1 << 20
	}
	if f > 1<<30 {
		f = 1 << 30
	}
	return f
}

func check(s Spec) checkResult {
	var r checkResult
	fi, err := os.Stat(s.Path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			r.err = fmt.Errorf("path %s does not exist", s.Path)
		} else {
			r.err = fmt.Errorf("cannot stat %s: %v", s.Path, err)
		}
		return r
	}
	if !fi.IsDir() {
		r.err = fmt.Errorf("path %s is not a directory", s.Path)
		return r
	}
	var st unix.Statfs_t
	if err := unix.Statfs(s.Path, &st); err != nil {
		r.err = fmt.Errorf("statfs %s: %v", s.Path, err)
		return r
	}
	r.statOK = true
	r.total = int64(st.Blocks) * int64(st.Bsize)
	r.available = int64(st.Bavail) * int64(st.Bsize)
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		r.dev = uint64(sys.Dev)
	}
	if st.Flags&unix.ST_RDONLY != 0 {
		r.err = fmt.Errorf("filesystem at %s is read-only", s.Path)
		return r
	}
	if err := probeWrite(s.Path); err != nil {
		r.err = fmt.Errorf("pool %s is not writable: %v", s.Path, err)
		return r
	}
	if f := minFree(r.total); r.available < f {
		r.err = fmt.Errorf("pool is full: %d bytes free of %d", r.available, r.total)
	}
	return r
}

// probeWrite creates and removes a file in the pool's metadata directory: statfs flags do not
// catch every read-only or broken filesystem (errors=remount-ro, a dead disk, wrong permissions).
func probeWrite(path string) error {
	dir := filepath.Join(path, MetaDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return err
	}
	name := f.Name()
	_, werr := f.Write([]byte("ok"))
	cerr := f.Close()
	rerr := os.Remove(name)
	return errors.Join(werr, cerr, rerr)
}

func equalLabels(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}
