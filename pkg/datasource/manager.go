package datasource

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource/localsource"
	"github.com/cistern-csi/cistern/pkg/datasource/nfssource"
	"github.com/cistern-csi/cistern/pkg/datasource/s3source"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// Config configures a node's Manager.
type Config struct {
	// Pools are the pool directories whose caches the manager evicts from and reports on. Pools
	// passed to Ensure are added on first use.
	Pools []string
	// LocalSourceRoots are the only node directories file:// sources may read (flag
	// --local-source-roots). Empty disables file:// sources.
	LocalSourceRoots []string
	// Concurrency bounds parallel reads from sources across all datasets on the node.
	Concurrency int
	// BandwidthBytesPerSec caps staging throughput across the node; 0 is unlimited.
	BandwidthBytesPerSec int64
	// LowWatermark and HighWatermark are fractions of a pool's size kept free: under Low, unused
	// cached datasets are evicted (least recently used first) until High is free again.
	LowWatermark, HighWatermark float64
	// ChunkSize is the size of a ranged read of a large object (0: 32 MiB).
	ChunkSize int64
	// Retries is how often a retryable read is attempted before the staging attempt fails.
	Retries int
	// OnEvict is told about every eviction (the driver turns it into an event).
	OnEvict func(EvictEvent)
	// EvictInterval is how often Run checks watermarks (0: one minute).
	EvictInterval time.Duration
}

// Phase is the state of a dataset on one pool.
type Phase string

const (
	PhaseListing  Phase = "Listing"
	PhaseFetching Phase = "Fetching"
	PhaseSyncing  Phase = "Syncing"
	PhaseReady    Phase = "Ready"
	PhaseFailed   Phase = "Failed"
)

// Status is the progress of a dataset on one pool.
type Status struct {
	Dataset      string
	Phase        Phase
	BytesDone    int64
	BytesTotal   int64
	ObjectsDone  int64
	ObjectsTotal int64
	// CacheHit is set when the dataset was already on the node.
	CacheHit bool
}

// Ready reports whether the dataset's tree is complete.
func (s Status) Ready() bool { return s.Phase == PhaseReady }

// String is the message for logs and the volume condition.
func (s Status) String() string {
	if s.Phase == PhaseListing || s.BytesTotal == 0 && s.Phase != PhaseReady {
		return fmt.Sprintf("dataset %s: %s", s.Dataset, s.Phase)
	}
	return fmt.Sprintf("dataset %s: %s, %s of %s (%d/%d objects, %.0f%%)", s.Dataset, s.Phase,
		humanBytes(s.BytesDone), humanBytes(s.BytesTotal), s.ObjectsDone, s.ObjectsTotal,
		100*float64(s.BytesDone)/float64(max(s.BytesTotal, 1)))
}

// Request asks for a dataset on a pool.
type Request struct {
	Spec  *Spec
	Creds Credentials
	// Pool is the pool directory; the cache lives in <Pool>/.cistern-cache.
	Pool string
	// Capacity is the volume's size in bytes; a dataset that cannot fit is refused. 0: no check.
	Capacity int64
}

// Manager stages datasets into per-pool caches. One per node.
type Manager struct {
	cfg Config
	// base is the context of every staging job; Run cancels it when it returns, so a shutting
	// down driver stops its downloads.
	base    context.Context
	stop    context.CancelFunc
	slots   chan struct{}
	limiter *rate.Limiter
	metrics *metrics

	mu     sync.Mutex
	jobs   map[string]*job  // pool/id -> running staging
	failed map[string]error // pool/id -> last failure, reported once
	pools  map[string]bool  // known pool dirs
	inUse  map[string]int   // pool/id -> in-memory users (Populate)
	poolMu map[string]*sync.Mutex
}

// NewManager validates cfg and returns a Manager.
func NewManager(cfg Config) (*Manager, error) {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	if cfg.ChunkSize <= 0 {
		cfg.ChunkSize = 32 << 20
	}
	if cfg.Retries <= 0 {
		cfg.Retries = 8
	}
	if cfg.LowWatermark == 0 && cfg.HighWatermark == 0 {
		cfg.LowWatermark, cfg.HighWatermark = 0.10, 0.20
	}
	if cfg.LowWatermark < 0 || cfg.HighWatermark > 1 || cfg.LowWatermark > cfg.HighWatermark {
		return nil, fmt.Errorf("watermarks must satisfy 0 <= low (%v) <= high (%v) <= 1", cfg.LowWatermark, cfg.HighWatermark)
	}
	if cfg.EvictInterval <= 0 {
		cfg.EvictInterval = time.Minute
	}
	var roots []string
	for _, r := range cfg.LocalSourceRoots {
		if !filepath.IsAbs(r) {
			return nil, fmt.Errorf("local source root %q is not absolute", r)
		}
		roots = append(roots, filepath.Clean(r))
	}
	cfg.LocalSourceRoots = roots
	base, stop := context.WithCancel(context.Background())
	m := &Manager{
		cfg:    cfg,
		base:   base,
		stop:   stop,
		slots:  make(chan struct{}, cfg.Concurrency),
		jobs:   map[string]*job{},
		failed: map[string]error{},
		pools:  map[string]bool{},
		inUse:  map[string]int{},
		poolMu: map[string]*sync.Mutex{},
	}
	if cfg.BandwidthBytesPerSec > 0 {
		burst := int(min(max(cfg.BandwidthBytesPerSec/10, copyBufSize), 1<<30))
		m.limiter = rate.NewLimiter(rate.Limit(cfg.BandwidthBytesPerSec), burst)
	}
	m.metrics = newMetrics(m)
	for _, p := range cfg.Pools {
		m.addPool(p)
	}
	return m, nil
}

func (m *Manager) addPool(pool string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.pools[pool] {
		m.pools[pool] = true
		m.poolMu[pool] = &sync.Mutex{}
	}
}

func (m *Manager) poolLock(pool string) *sync.Mutex {
	m.addPool(pool)
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.poolMu[pool]
}

func jobKey(pool, id string) string { return pool + "\x00" + id }

// Ensure starts staging req's dataset on req.Pool, or joins the staging under way, and returns its
// progress without waiting. A finished failure is returned once, then a new attempt starts.
func (m *Manager) Ensure(ctx context.Context, req Request) (Status, error) {
	st, _, err := m.ensure(ctx, req)
	return st, err
}

// Wait is Ensure, then waits until the dataset is ready, staging fails or ctx ends. When ctx ends
// first it returns the progress and no error: the caller reports "in progress" and retries.
func (m *Manager) Wait(ctx context.Context, req Request) (Status, error) {
	st, j, err := m.ensure(ctx, req)
	if err != nil || j == nil {
		return st, err
	}
	select {
	case <-j.done:
		return m.finished(req, j)
	case <-ctx.Done():
		return j.status(), nil
	}
}

// Listed is Ensure, then waits until the dataset's manifest is taken, so its size is known, or
// staging fails, or ctx ends. A dataset that cannot fit req.Capacity is refused (OutOfRange)
// before any object is read. When ctx ends first it returns the progress and no error.
func (m *Manager) Listed(ctx context.Context, req Request) (Status, error) {
	st, j, err := m.ensure(ctx, req)
	if err != nil || j == nil {
		return st, err
	}
	select {
	case <-j.listed:
		st := j.status()
		if err := checkCapacity(req, st.BytesTotal, j.alloc.Load(), true); err != nil {
			return st, fmt.Errorf("%s: %w", req.Spec.describe(), err)
		}
		return st, nil
	case <-j.done:
		return m.finished(req, j)
	case <-ctx.Done():
		return j.status(), nil
	}
}

// finished returns the outcome of a finished job, and forgets its failure: it was reported.
func (m *Manager) finished(req Request, j *job) (Status, error) {
	if j.err != nil {
		m.mu.Lock()
		delete(m.failed, jobKey(req.Pool, req.Spec.ID()))
		m.mu.Unlock()
	}
	return j.status(), j.err
}

func (m *Manager) ensure(ctx context.Context, req Request) (Status, *job, error) {
	if req.Spec == nil {
		return Status{}, nil, source.Errorf(source.Invalid, "no dataset spec")
	}
	id := req.Spec.ID()
	m.addPool(req.Pool)
	dir := datasetDir(req.Pool, id)
	key := jobKey(req.Pool, id)
	logger := klog.FromContext(ctx).WithValues("dataset", req.Spec.String(), "datasetID", id, "pool", req.Pool)

	pl := m.poolLock(req.Pool)
	pl.Lock()
	m.mu.Lock()
	j := m.jobs[key]
	ferr, failed := m.failed[key]
	if failed && j == nil {
		delete(m.failed, key)
	}
	m.mu.Unlock()

	if j != nil {
		pl.Unlock()
		st := j.status()
		// The job may still be listing: then its size so far is a lower bound.
		if err := checkCapacity(req, st.BytesTotal, j.alloc.Load(), j.isListed()); err != nil {
			return st, nil, fmt.Errorf("%s: %w", req.Spec.describe(), err)
		}
		return st, j, nil
	}
	if failed {
		pl.Unlock()
		return Status{Dataset: req.Spec.Source, Phase: PhaseFailed}, nil, ferr
	}
	if isReady(dir) {
		touch(dir)
		pl.Unlock()
		md, err := readMeta(dir)
		if err != nil {
			return Status{}, nil, fmt.Errorf("%s: %w", req.Spec.describe(), err)
		}
		if err := checkCapacity(req, md.Bytes, md.Alloc, true); err != nil {
			return Status{}, nil, fmt.Errorf("%s: %w", req.Spec.describe(), err)
		}
		// Data staged with one tenant's credentials is served to another only if it may read it.
		if err := m.checkAccess(ctx, req); err != nil {
			return Status{}, nil, err
		}
		m.metrics.cacheHits.Inc()
		return Status{Dataset: req.Spec.Source, Phase: PhaseReady, BytesDone: md.Bytes, BytesTotal: md.Bytes,
			ObjectsDone: md.Objects, ObjectsTotal: md.Objects, CacheHit: true}, nil, nil
	}
	src, err := m.openSource(req)
	if err != nil {
		pl.Unlock()
		return Status{}, nil, fmt.Errorf("%s: %w", req.Spec.describe(), err)
	}
	j = newJob(m, req, dir, src)
	m.mu.Lock()
	m.jobs[key] = j
	m.mu.Unlock()
	pl.Unlock()
	logger.Info("staging dataset", "credentials", req.Creds.String())
	go m.runJob(logger, key, j)
	return j.status(), j, nil
}

func (m *Manager) runJob(logger klog.Logger, key string, j *job) {
	start := time.Now()
	err := j.run(klog.NewContext(m.base, logger))
	j.src.Close()
	m.mu.Lock()
	delete(m.jobs, key)
	if err != nil {
		m.failed[key] = err
	}
	m.mu.Unlock()
	j.err = err
	close(j.done)
	st := j.status()
	if err != nil {
		m.metrics.stagings.WithLabelValues("failed").Inc()
		logger.Error(err, "staging failed", "permanent", source.IsPermanent(err), "bytesDone", st.BytesDone)
		return
	}
	m.metrics.stagings.WithLabelValues("ready").Inc()
	m.metrics.stagedBytes.Add(float64(st.BytesTotal))
	logger.Info("dataset ready", "bytes", st.BytesTotal, "objects", st.ObjectsTotal, "duration", time.Since(start))
	m.evictPool(m.base, j.pool, 0)
}

// checkCapacity refuses a dataset whose files take more than the volume has room for; complete
// is false while the listing is still counting. Callers prefix the dataset's name.
func checkCapacity(req Request, bytes, alloc int64, complete bool) error {
	if req.Capacity <= 0 || bytes == 0 && alloc == 0 {
		return nil
	}
	if alloc > req.Capacity {
		atLeast := ""
		if !complete {
			atLeast = "at least "
		}
		return source.Errorf(source.TooLarge, "it holds %s%s (%s on disk), more than the %s the volume has room for",
			atLeast, humanBytes(bytes), humanBytes(alloc), humanBytes(req.Capacity))
	}
	return nil
}

func (m *Manager) checkAccess(ctx context.Context, req Request) error {
	if req.Spec.Scheme == SchemeNFS {
		return nil // AUTH_UNIX carries no per-tenant secret to check.
	}
	// S3: the caller's credentials must read the bucket. file://: the path must still be under
	// an allowed root (the admin may have narrowed --local-source-roots since).
	src, err := m.openSource(req)
	if err != nil {
		return err
	}
	defer src.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := src.CheckAccess(ctx); err != nil {
		return fmt.Errorf("%s: %w", req.Spec.describe(), err)
	}
	return nil
}

func (m *Manager) openSource(req Request) (source.Source, error) {
	s := req.Spec
	switch s.Scheme {
	case SchemeS3:
		return s3source.New(s3source.Config{
			Bucket: s.Bucket, Prefix: s.Prefix, Endpoint: s.Endpoint, Region: s.Region, PathStyle: s.PathStyle,
			AccessKeyID: req.Creds.AccessKeyID, SecretAccessKey: req.Creds.SecretAccessKey,
			SessionToken: req.Creds.SessionToken, MaxConns: m.cfg.Concurrency,
		})
	case SchemeNFS:
		return nfssource.New(s.Host, s.Path)
	case SchemeLocal:
		return localsource.New(s.Path, m.cfg.LocalSourceRoots)
	}
	return nil, source.Errorf(source.Invalid, "unsupported scheme %q", s.Scheme)
}

// TreePath returns the ready dataset's directory on pool, for a read-only bind mount. Pair it
// with Acquire so eviction leaves it alone.
func (m *Manager) TreePath(pool string, spec *Spec) (string, error) {
	dir := datasetDir(pool, spec.ID())
	if !isReady(dir) {
		return "", source.Errorf(source.NotFound, "%s is not staged on pool %s", spec.describe(), pool)
	}
	return filepath.Join(dir, treeDir), nil
}

// Acquire records that volumeID uses the dataset's tree on pool (a read-only bind mount). The
// reference is a file, so it survives driver restarts; ReleaseID removes it. Both are idempotent.
func (m *Manager) Acquire(pool string, spec *Spec, volumeID string) error {
	dir := datasetDir(pool, spec.ID())
	pl := m.poolLock(pool)
	pl.Lock()
	defer pl.Unlock()
	if !isReady(dir) {
		return source.Errorf(source.NotFound, "%s is not staged on pool %s", spec.describe(), pool)
	}
	if err := os.MkdirAll(filepath.Join(dir, refsDir), 0o755); err != nil {
		return err
	}
	touch(dir)
	return writeFileSync(filepath.Join(dir, refsDir, refName(volumeID)), []byte(volumeID))
}

// ReleaseID drops volumeID's reference to the dataset id on pool.
func (m *Manager) ReleaseID(pool, id, volumeID string) error {
	dir := datasetDir(pool, id)
	err := os.Remove(filepath.Join(dir, refsDir, refName(volumeID)))
	if err != nil && !isNotExist(err) {
		return err
	}
	touch(dir)
	return nil
}

// Run evicts on every pool periodically until ctx ends, then stops the staging jobs.
func (m *Manager) Run(ctx context.Context) {
	defer m.stop()
	t := time.NewTicker(m.cfg.EvictInterval)
	defer t.Stop()
	for {
		for _, p := range m.poolList() {
			m.evictPool(ctx, p, 0)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *Manager) poolList() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.pools))
	for p := range m.pools {
		out = append(out, p)
	}
	return out
}

func (m *Manager) busy(pool, id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := jobKey(pool, id)
	return m.jobs[key] != nil || m.inUse[key] > 0
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for v := n / unit; v >= unit; v /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// Status reports a dataset's state on pool without starting anything: the progress of a staging
// under way, Ready when cached, or the last failure. ok is false when the pool knows nothing of it.
func (m *Manager) Status(pool string, spec *Spec) (Status, bool, error) {
	id := spec.ID()
	m.mu.Lock()
	j := m.jobs[jobKey(pool, id)]
	ferr, failed := m.failed[jobKey(pool, id)]
	m.mu.Unlock()
	switch {
	case j != nil:
		return j.status(), true, nil
	case failed:
		return Status{Dataset: spec.Source, Phase: PhaseFailed}, true, ferr
	}
	dir := datasetDir(pool, id)
	if !isReady(dir) {
		return Status{}, false, nil
	}
	md, err := readMeta(dir)
	if err != nil {
		return Status{}, true, err
	}
	return Status{Dataset: spec.Source, Phase: PhaseReady, BytesDone: md.Bytes, BytesTotal: md.Bytes,
		ObjectsDone: md.Objects, ObjectsTotal: md.Objects}, true, nil
}
