package datasource

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource/egress"
	"github.com/cistern-csi/cistern/pkg/datasource/localsource"
	"github.com/cistern-csi/cistern/pkg/datasource/nfssource"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
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
	// ProgressInterval is how often, while a dataset is being staged, the inventory generation
	// moves so that published progress follows (0: five seconds). At rest it does not move.
	ProgressInterval time.Duration
	// AccessProofTTL is how long a caller's full proof of access to a cached dataset (its own
	// listing matching the cache) is remembered; within it a cache hit costs one pinned read.
	// 0 lists on every hit.
	AccessProofTTL time.Duration
	// NFSServers are the NFS servers (host or host:port) that inline volumes may name (flag
	// --nfs-servers); empty refuses nfs:// in inline volumes. Administrators' StorageClasses and
	// PersistentVolumes may name any server.
	NFSServers []string
	// Limits bound what one dataset may make the node spend; zero fields get DefaultLimits.
	Limits Limits
	// NFSUID and NFSGID are the AUTH_UNIX identity the NFS client presents (flags --nfs-uid,
	// --nfs-gid); 65534 (nobody) unless set.
	NFSUID, NFSGID *uint32
	// TenantEndpoints are the S3 endpoints tenant datasets (Spec.Tenant) may name (flag
	// --tenant-s3-endpoints); empty refuses every tenant endpoint, "*" allows any that is not link-local or a metadata
	// service.
	TenantEndpoints egress.Allow
	// Peers, when set, lets staging read S3 datasets from other nodes that hold or are staging
	// the same version (peerfetch.go); nil reads everything from the source.
	Peers *peer.Network
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
	// Version names the cached data the caller proved it may read (the manifest's digest), once
	// it is known; Acquire and Populate hand out only that version.
	Version string
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
	limits  Limits
	metrics *metrics

	// principalKey keys the hash that tells callers apart (access.go).
	principalKey []byte
	nfsUID       uint32
	nfsGID       uint32

	mu     sync.Mutex
	jobs   map[string]*job  // pool/id -> running staging
	failed map[string]error // pool/id/principal -> last failure, reported once to its caller
	// lastFail is the kind of each pool/id's last failure, for the inventory, until the next attempt.
	lastFail map[string]failure
	pools    map[string]bool      // known pool dirs
	inUse    map[string]int       // pool/id -> in-memory users (Populate)
	proofs   map[string]time.Time // digest/principal -> proof valid until
	proving  map[string]*proof    // digest/principal -> proof under way
	denials  map[string]denial    // digest/principal -> refused proof, remembered
	// proofSlots bounds the full proofs under way (access.go).
	proofSlots chan struct{}
	// perSource holds the concurrency slots of each source endpoint.
	perSource map[string]chan struct{}
	// listings and listingsPerSource bound the listings under way (Limits.Listings).
	listings          chan struct{}
	listingsPerSource map[string]chan struct{}
	poolMu            map[string]*sync.Mutex

	// canons names the entries of ready datasets for peers' requests (peerserve.go).
	canons canons

	// changes moves whenever an Inventory would read differently (inventory.go).
	changes changes
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
	if cfg.ProgressInterval <= 0 {
		cfg.ProgressInterval = 5 * time.Second
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
		cfg:          cfg,
		base:         base,
		stop:         stop,
		slots:        make(chan struct{}, cfg.Concurrency),
		principalKey: newPrincipalKey(),
		nfsUID:       NobodyID,
		nfsGID:       NobodyID,
		jobs:         map[string]*job{},
		failed:       map[string]error{},
		lastFail:     map[string]failure{},
		pools:        map[string]bool{},
		inUse:        map[string]int{},
		proofs:       map[string]time.Time{},
		proving:      map[string]*proof{},
		denials:      map[string]denial{},
		proofSlots:   make(chan struct{}, concurrentProofs),
		perSource:    map[string]chan struct{}{},
		limits:       cfg.Limits.withDefaults(cfg.Concurrency),
		poolMu:       map[string]*sync.Mutex{},
	}
	m.listings = make(chan struct{}, m.limits.Listings)
	m.listingsPerSource = map[string]chan struct{}{}
	if cfg.NFSUID != nil {
		m.nfsUID = *cfg.NFSUID
	}
	if cfg.NFSGID != nil {
		m.nfsGID = *cfg.NFSGID
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

// NobodyID is the default AUTH_UNIX uid and gid of the NFS client: nobody, never root.
const NobodyID = 65534

// DefaultAccessProofTTL is the driver's default Config.AccessProofTTL.
const DefaultAccessProofTTL = 5 * time.Minute

// Ensure starts staging req's dataset on req.Pool, or joins the staging under way, and returns its
// progress without waiting. A finished failure is returned once to the caller whose attempt
// failed, then a new attempt starts.
func (m *Manager) Ensure(ctx context.Context, req Request) (Status, error) {
	st, _, err := m.ensure(ctx, req)
	return st, err
}

// Wait is Ensure, then waits until the dataset is ready, staging fails or ctx ends. When ctx ends
// first it returns the progress and no error: the caller reports "in progress" and retries.
func (m *Manager) Wait(ctx context.Context, req Request) (Status, error) {
	return m.await(ctx, req, nil, nil)
}

// Listed is Ensure, then waits until the dataset's manifest is taken, so its size is known, or
// staging fails, or ctx ends. A dataset that cannot fit req.Capacity is refused (OutOfRange)
// before any object is read. When ctx ends first it returns the progress and no error.
func (m *Manager) Listed(ctx context.Context, req Request) (Status, error) {
	listed := func(j *job) <-chan struct{} { return j.listed }
	return m.await(ctx, req, listed, func(j *job) (Status, error) {
		st := j.status()
		if err := checkCapacity(req, st.BytesTotal, j.alloc.Load(), true); err != nil {
			return st, fmt.Errorf("%s: %w", req.Spec.describe(), err)
		}
		return st, nil
	})
}

// await is Ensure, then waits for the job to end, or for the event (when set), which reached
// reports. A job that failed for another caller is that caller's outcome: this one makes an
// attempt of its own. When ctx ends first it returns the progress and no error.
func (m *Manager) await(ctx context.Context, req Request, event func(*job) <-chan struct{}, reached func(*job) (Status, error)) (Status, error) {
	for {
		st, j, err := m.ensure(ctx, req)
		if err != nil || j == nil {
			return st, err
		}
		var happened <-chan struct{} // nil: never
		if event != nil {
			happened = event(j)
		}
		select {
		case <-happened:
			return reached(j)
		case <-j.done:
			if m.othersFailure(req, j) {
				continue
			}
			return m.finished(req, j)
		case <-ctx.Done():
			return j.status(), nil
		}
	}
}

// othersFailure reports a finished job that failed for another caller than req's: that failure
// is its caller's to see, and req's caller makes an attempt of its own.
func (m *Manager) othersFailure(req Request, j *job) bool {
	return j.err != nil && j.principal != m.principal(req)
}

// finished returns the outcome of a finished job, and forgets its failure: it was reported.
func (m *Manager) finished(req Request, j *job) (Status, error) {
	if j.err != nil {
		m.mu.Lock()
		delete(m.failed, failKey(req.Pool, req.Spec.ID(), j.principal))
		m.mu.Unlock()
		m.changed()
	}
	return j.status(), j.err
}

func failKey(pool, id, principal string) string { return jobKey(pool, id) + "\x00" + principal }

// checking is the progress reported while a caller's access proof is still under way.
func checking(spec *Spec) Status { return Status{Dataset: spec.Source, Phase: PhaseListing} }

func (m *Manager) ensure(ctx context.Context, req Request) (Status, *job, error) {
	if req.Spec == nil {
		return Status{}, nil, source.Errorf(source.Invalid, "no dataset spec")
	}
	if err := m.admit(req.Spec); err != nil {
		return Status{}, nil, fmt.Errorf("%s: %w", req.Spec.describe(), err)
	}
	// The caller's endpoint policy holds on every path, also those that dial nothing (a join,
	// a remembered proof): a refused endpoint is refused here.
	if _, err := m.egressPolicy(req.Spec); err != nil {
		return Status{}, nil, err
	}
	id := req.Spec.ID()
	who := m.principal(req)
	m.addPool(req.Pool)
	dir := datasetDir(req.Pool, id)
	key := jobKey(req.Pool, id)
	fkey := failKey(req.Pool, id, who)
	logger := klog.FromContext(ctx).WithValues("dataset", req.Spec.String(), "datasetID", id, "pool", req.Pool)

	pl := m.poolLock(req.Pool)
	for retired := false; ; retired = true {
		pl.Lock()
		m.mu.Lock()
		j := m.jobs[key]
		ferr, failed := m.failed[fkey]
		if failed && j == nil {
			delete(m.failed, fkey)
		}
		m.mu.Unlock()

		if j != nil {
			pl.Unlock()
			return m.join(ctx, req, j, who)
		}
		if failed {
			pl.Unlock()
			m.changed()
			return Status{Dataset: req.Spec.Source, Phase: PhaseFailed}, nil, ferr
		}
		if isReady(dir) {
			touch(dir)
			pl.Unlock()
			m.changed()
			st, digest, err := m.hit(ctx, req, dir)
			if !errors.Is(err, errListingDiffers) || retired {
				return st, nil, err
			}
			// The caller sees other data than the cache holds: the source changed, or the caller's
			// credentials resolve to other data. It gets a staging of what it sees.
			logger.Info("cached dataset differs from the caller's listing; staging a new version")
			if err := m.retire(req.Pool, id, digest); err != nil {
				return Status{}, nil, fmt.Errorf("%s: %w", req.Spec.describe(), err)
			}
			continue
		}
		src, err := m.openSource(req)
		if err != nil {
			pl.Unlock()
			return Status{}, nil, fmt.Errorf("%s: %w", req.Spec.describe(), err)
		}
		j = newJob(m, req, dir, src)
		j.principal = who
		m.mu.Lock()
		m.jobs[key] = j
		delete(m.lastFail, key)
		m.mu.Unlock()
		pl.Unlock()
		m.changed()
		logger.Info("staging dataset", "credentials", req.Creds.String())
		go m.runJob(logger, key, j)
		return j.status(), j, nil
	}
}

// hit serves a ready cached dataset to a caller that proves it reads the same data.
func (m *Manager) hit(ctx context.Context, req Request, dir string) (Status, string, error) {
	md, err := readMeta(dir)
	if err != nil {
		return Status{}, "", fmt.Errorf("%s: %w", req.Spec.describe(), err)
	}
	if err := checkCapacity(req, md.Bytes, md.Alloc, true); err != nil {
		return Status{}, "", fmt.Errorf("%s: %w", req.Spec.describe(), err)
	}
	digest, err := manifestDigest(dir, md)
	if err != nil {
		return Status{}, "", fmt.Errorf("%s: %w", req.Spec.describe(), err)
	}
	if err := m.prove(ctx, req, dir, md, digest); err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return checking(req.Spec), digest, nil
		}
		return Status{}, digest, fmt.Errorf("%s: %w", req.Spec.describe(), err)
	}
	m.metrics.cacheHits.Inc()
	return Status{Dataset: req.Spec.Source, Phase: PhaseReady, BytesDone: md.Bytes, BytesTotal: md.Bytes,
		ObjectsDone: md.Objects, ObjectsTotal: md.Objects, CacheHit: true, Version: digest}, digest, nil
}

// join hands a staging under way to a caller: at once to the caller that started it; to any
// other once the manifest is taken and the caller proved it reads the same data. Until then the
// caller is told only that the dataset is being listed.
func (m *Manager) join(ctx context.Context, req Request, j *job, who string) (Status, *job, error) {
	j.want()
	if j.principal != who {
		select {
		case <-j.listed:
		case <-j.done:
			if !j.isListed() {
				return checking(req.Spec), j, nil // failed or ended before its listing: the caller retries
			}
		case <-ctx.Done():
			return checking(req.Spec), nil, nil
		}
		md, digest := j.manifestMeta()
		if err := m.prove(ctx, req, j.dir, md, digest); err != nil {
			switch {
			case ctx.Err() != nil && errors.Is(err, ctx.Err()):
				return checking(req.Spec), nil, nil
			case errors.Is(err, errListingDiffers):
				err = source.Wrap(source.Retryable, err, "a staging of other data under this name is under way; it is staged anew for this caller after it ends")
			}
			return Status{}, nil, fmt.Errorf("%s: %w", req.Spec.describe(), err)
		}
	}
	st := j.status()
	// The job may still be listing: then its size so far is a lower bound.
	if err := checkCapacity(req, st.BytesTotal, j.alloc.Load(), j.isListed()); err != nil {
		return st, nil, fmt.Errorf("%s: %w", req.Spec.describe(), err)
	}
	return st, j, nil
}

// admit refuses what this caller may not name: an NFS server that inline volumes may not reach.
func (m *Manager) admit(spec *Spec) error {
	if spec.Inline && spec.Scheme == SchemeNFS && !slices.Contains(m.cfg.NFSServers, spec.Host) {
		return source.Errorf(source.Denied, "NFS server %s is not allowed in inline volumes (the administrator allows servers with --nfs-servers)", spec.Host)
	}
	return nil
}

func (m *Manager) runJob(logger klog.Logger, key string, j *job) {
	start := time.Now()
	err := j.run(klog.NewContext(m.base, logger))
	j.src.Close()
	m.mu.Lock()
	delete(m.jobs, key)
	if err != nil {
		m.failed[key+"\x00"+j.principal] = err
		m.recordFailureLocked(key, j.req.Spec, err, time.Now())
	}
	m.mu.Unlock()
	j.err = err
	close(j.done)
	m.changed()
	st := j.status()
	if err != nil {
		m.metrics.stagings.WithLabelValues("failed").Inc()
		logger.Error(err, "staging failed", "permanent", source.IsPermanent(err), "bytesDone", st.BytesDone)
		return
	}
	// Every object was read with the stager's credentials, pinned to the manifest.
	m.remember(st.Version, j.principal)
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

func (m *Manager) openSource(req Request) (source.Source, error) {
	s := req.Spec
	switch s.Scheme {
	case SchemeS3:
		policy, err := m.egressPolicy(s)
		if err != nil {
			return nil, err
		}
		return s3source.New(s3source.Config{
			Bucket: s.Bucket, Prefix: s.Prefix, Endpoint: s.Endpoint, Region: s.Region, PathStyle: s.PathStyle,
			AccessKeyID: req.Creds.AccessKeyID, SecretAccessKey: req.Creds.SecretAccessKey,
			SessionToken: req.Creds.SessionToken, MaxConns: m.cfg.Concurrency, Egress: policy,
			MaxListed: m.limits.MaxObjects,
		})
	case SchemeNFS:
		return nfssource.New(s.Host, s.Path, m.nfsUID, m.nfsGID)
	case SchemeLocal:
		return localsource.New(s.Path, m.cfg.LocalSourceRoots)
	}
	return nil, source.Errorf(source.Invalid, "unsupported scheme %q", s.Scheme)
}

// TreePath returns the ready dataset's directory on pool. It proves nothing of the caller: volumes
// get the tree from Acquire, after Wait proved the caller may read it.
func (m *Manager) TreePath(pool string, spec *Spec) (string, error) {
	dir := datasetDir(pool, spec.ID())
	if !isReady(dir) {
		return "", source.Errorf(source.NotFound, "%s is not staged on pool %s", spec.describe(), pool)
	}
	return filepath.Join(dir, treeDir), nil
}

// Acquire records that volumeID uses the dataset's tree on pool (a read-only bind mount) and
// returns the tree's path. version is the Status.Version the caller proved it may read (empty: any);
// a dataset replaced since is refused as changed, and the caller asks again. The reference is a
// file, so it survives driver restarts; ReleaseID removes it. Both are idempotent.
func (m *Manager) Acquire(pool string, spec *Spec, version, volumeID string) (string, error) {
	dir := datasetDir(pool, spec.ID())
	pl := m.poolLock(pool)
	pl.Lock()
	defer pl.Unlock()
	if err := checkVersion(dir, spec, version); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Join(dir, refsDir), 0o755); err != nil {
		return "", err
	}
	touch(dir)
	if err := writeFileSync(filepath.Join(dir, refsDir, refName(volumeID)), []byte(volumeID)); err != nil {
		return "", err
	}
	m.changed()
	return filepath.Join(dir, treeDir), nil
}

// checkVersion says whether dir holds the ready dataset version the caller proved it may read.
func checkVersion(dir string, spec *Spec, version string) error {
	if !isReady(dir) {
		return source.Errorf(source.Retryable, "%s is not staged on this pool (any more); retry", spec.describe())
	}
	if version == "" {
		return nil
	}
	md, err := readMeta(dir)
	if err != nil {
		return err
	}
	if d, err := manifestDigest(dir, md); err != nil || d != version {
		return errors.Join(err, source.Errorf(source.Retryable, "%s was replaced by a newer version since it was checked; retry", spec.describe()))
	}
	return nil
}

// retiredSep separates a dataset ID from the suffix of a version that a newer one replaced.
const retiredSep = ".retired-"

// retire moves the ready version of dataset id on pool aside when it still has the given
// digest, so that a new version can be staged in its place: volumes that use it keep it (their
// bind mounts follow the directory), new callers never see it, and it is deleted with its last
// reference. A version nobody uses is deleted at once.
func (m *Manager) retire(pool, id, digest string) error {
	pl := m.poolLock(pool)
	pl.Lock()
	defer pl.Unlock()
	dir := datasetDir(pool, id)
	if m.busy(pool, id) {
		return source.Errorf(source.Retryable, "the cached version is being copied into a volume; retry")
	}
	if !isReady(dir) {
		return nil // replaced meanwhile
	}
	md, err := readMeta(dir)
	if err != nil {
		return err
	}
	if d, err := manifestDigest(dir, md); err != nil || d != digest {
		return err // replaced meanwhile
	}
	defer m.changed()
	if refCount(dir) == 0 {
		return removeDataset(pool, id)
	}
	to := dir + retiredSep + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := os.Rename(dir, to); err != nil {
		return err
	}
	return syncDir(cacheDir(pool))
}

// removeDataset deletes a dataset directory: renamed to trash first, so a crash leaves nothing
// that looks like a dataset.
func removeDataset(pool, name string) error {
	trash := filepath.Join(cacheDir(pool), trashPrefix+name)
	if err := os.Rename(datasetDir(pool, name), trash); err != nil {
		return err
	}
	return removeAllQuick(trash)
}

// ReleaseID drops volumeID's reference to the dataset id on pool. The reference may be in a
// retired version, which goes with its last reference.
func (m *Manager) ReleaseID(pool, id, volumeID string) error {
	dir := datasetDir(pool, id)
	err := os.Remove(filepath.Join(dir, refsDir, refName(volumeID)))
	if err == nil || !isNotExist(err) {
		touch(dir)
		m.changed()
		return err
	}
	retired, _ := filepath.Glob(dir + retiredSep + "*")
	for _, r := range retired {
		err := os.Remove(filepath.Join(r, refsDir, refName(volumeID)))
		if isNotExist(err) {
			continue
		}
		if err != nil {
			return err
		}
		m.changed()
		pl := m.poolLock(pool)
		pl.Lock()
		defer pl.Unlock()
		if refCount(r) == 0 {
			return removeDataset(pool, filepath.Base(r))
		}
		return nil
	}
	return nil
}

// Run evicts on every pool periodically until ctx ends, then stops the staging jobs.
func (m *Manager) Run(ctx context.Context) {
	defer m.stop()
	t := time.NewTicker(m.cfg.EvictInterval)
	defer t.Stop()
	go m.watchProgress(ctx.Done(), m.cfg.ProgressInterval)
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
// under way, or Ready when cached. ok is false when the pool knows nothing of it. Failures are not
// reported here: each is told to the caller whose attempt failed, and to no other tenant.
func (m *Manager) Status(pool string, spec *Spec) (Status, bool, error) {
	id := spec.ID()
	m.mu.Lock()
	j := m.jobs[jobKey(pool, id)]
	m.mu.Unlock()
	if j != nil {
		return j.status(), true, nil
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
