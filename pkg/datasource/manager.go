package datasource

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource/access"
	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"github.com/cistern-csi/cistern/pkg/datasource/dataset"
	"github.com/cistern-csi/cistern/pkg/datasource/egress"
	"github.com/cistern-csi/cistern/pkg/datasource/localsource"
	"github.com/cistern-csi/cistern/pkg/datasource/nfs4source"
	"github.com/cistern-csi/cistern/pkg/datasource/nfssource"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/pkg/datasource/s3source"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/pkg/datasource/stage"
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
	// UnverifiableObjects is what becomes of objects nothing can check (flag
	// --unverifiable-objects; "": RefuseUnverifiable). OnUnverifiable is told of each (the
	// driver turns it into an event).
	UnverifiableObjects UnverifiablePolicy
	OnUnverifiable      func(UnverifiableEvent)
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
	// S3CABundleDir holds the CA bundles datasets may name (parameter caBundle; flag
	// --s3-ca-bundles): a ConfigMap or Secret of the administrator's, one bundle per key.
	S3CABundleDir string
	// S3AllowPlainHTTP lets S3 endpoints off the node be plain http:// (flag
	// --s3-allow-plain-http); without it they are refused.
	S3AllowPlainHTTP bool
	// STSEndpoint is the STS web-identity datasets exchange pods' tokens at (flag
	// --sts-endpoint); empty: AWS STS of the dataset's region. WebIdentityAudience is the
	// audience of those tokens (flag --web-identity-audience; DefaultWebIdentityAudience).
	STSEndpoint, WebIdentityAudience string
	// ServiceAccountRoles reads the role a pod's ServiceAccount names, for datasets with
	// roleFrom=serviceAccount; nil (a node plugin without API access) refuses them.
	ServiceAccountRoles ServiceAccountRoles
	// WebIdentityRoles are the roles web-identity datasets may take (flag --web-identity-roles):
	// path.Match patterns of role ARNs; empty allows any, and the STS alone decides.
	WebIdentityRoles []string
	// Peers, when set, lets staging read S3 datasets from other nodes that hold or are staging
	// the same version (stage/peers.go); nil reads everything from the source.
	Peers *peer.Network
}

// Status and Phase are the staging engine's; these names keep the package's API.
type (
	Status = stage.Status
	Phase  = stage.Phase
)

const (
	PhaseListing  = stage.PhaseListing
	PhaseFetching = stage.PhaseFetching
	PhaseSyncing  = stage.PhaseSyncing
	PhaseReady    = stage.PhaseReady
	PhaseFailed   = stage.PhaseFailed
)

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
	limits  Limits
	metrics *metrics

	// engine runs the staging jobs within the node's limits.
	engine *stage.Engine

	// access proves callers' access and remembers the proofs.
	access *access.Prover
	nfsUID uint32
	nfsGID uint32

	// cache holds the datasets in the pools: layout, references, eviction, inventory.
	cache *cache.Cache

	mu sync.Mutex
	// jobs are the stagings under way, by pool/id: the one in the dataset's directory first (if
	// any), then those of other versions beside it (cache.Beside).
	jobs   map[string][]*staging
	failed map[string]error // pool/id/principal -> last failure, reported once to its caller
	// lastFail is the kind of each pool/id's last failure, for the inventory, until the next attempt.
	lastFail map[string]failure

	// store serves peers what the cache and the stagings under way hold (peer.CacheStore).
	store *peer.CacheStore
	// tokens are the pods' tokens their web-identity reads exchange (podtokens.go).
	tokens podTokens
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
	if cfg.UnverifiableObjects == "" {
		cfg.UnverifiableObjects = RefuseUnverifiable
	}
	if err := cfg.UnverifiableObjects.validate(); err != nil {
		return nil, err
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
		cfg:      cfg,
		base:     base,
		stop:     stop,
		nfsUID:   NobodyID,
		nfsGID:   NobodyID,
		jobs:     map[string][]*staging{},
		failed:   map[string]error{},
		lastFail: map[string]failure{},
		limits:   cfg.Limits.WithDefaults(cfg.Concurrency),
	}
	if cfg.NFSUID != nil {
		m.nfsUID = *cfg.NFSUID
	}
	if cfg.NFSGID != nil {
		m.nfsGID = *cfg.NFSGID
	}
	m.metrics = newMetrics(m)
	m.cache = cache.New(cache.Config{LowWatermark: cfg.LowWatermark, HighWatermark: cfg.HighWatermark, OnEvict: m.evicted}, cfg.Pools...)
	listings := dataset.NewListingSlots(m.limits)
	m.access = access.New(access.Config{TTL: cfg.AccessProofTTL, Limits: m.limits, Listings: listings,
		Concurrency: cfg.Concurrency, NFSUID: m.nfsUID, NFSGID: m.nfsGID})
	m.store = &peer.CacheStore{Staging: m.stagingVersion, Stagings: m.stagingVersions, Pools: m.cache.Pools}
	ec := stage.Config{Concurrency: cfg.Concurrency, BandwidthBytesPerSec: cfg.BandwidthBytesPerSec,
		ChunkSize: cfg.ChunkSize, Retries: cfg.Retries, Limits: m.limits, Listings: listings, Cache: m.cache,
		Metrics: m.metrics.staging(), Unverifiable: m.unverifiable}
	if cfg.Peers != nil {
		ec.Peers = cfg.Peers // a nil *peer.Network stays a nil interface
	}
	m.engine = stage.NewEngine(ec)
	return m, nil
}

// staging is a staging job as the coordinator keeps it: whose credentials stage, its pin in the
// cache, and its outcome once it ended.
type staging struct {
	*stage.Job
	// principal is the caller whose credentials stage (package access).
	principal string
	// unpin drops the job's pin on its dataset in the cache (cache.Cache.PinStaging).
	unpin func()
	// done is closed when the job ended and left m.jobs; err is then its outcome.
	done chan struct{}
	err  error
	// beside is set for a staging in a directory of its own beside the dataset's (cache.Beside).
	beside bool
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
	listed := func(j *staging) <-chan struct{} { return j.Listed() }
	return m.await(ctx, req, listed, func(j *staging) (Status, error) {
		st := j.Status()
		if err := checkCapacity(req, st.BytesTotal, j.Alloc(), true); err != nil {
			return st, fmt.Errorf("%s: %w", req.Spec.Describe(), err)
		}
		return st, nil
	})
}

// await is Ensure, then waits for the job to end, or for the event (when set), which reached
// reports. A job that failed for another caller is that caller's outcome: this one makes an
// attempt of its own. When ctx ends first it returns the progress and no error.
func (m *Manager) await(ctx context.Context, req Request, event func(*staging) <-chan struct{}, reached func(*staging) (Status, error)) (Status, error) {
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
			return j.Status(), nil
		}
	}
}

// othersFailure reports a finished job that failed for another caller than req's: that failure
// is its caller's to see, and req's caller makes an attempt of its own.
func (m *Manager) othersFailure(req Request, j *staging) bool {
	return j.err != nil && j.principal != m.principal(req)
}

// finished returns the outcome of a finished job, and forgets its failure: it was reported.
func (m *Manager) finished(req Request, j *staging) (Status, error) {
	if j.err != nil {
		m.mu.Lock()
		delete(m.failed, failKey(req.Pool, req.Spec.ID(), j.principal))
		m.mu.Unlock()
		m.cache.Changed()
	}
	return j.Status(), j.err
}

// principal names the caller of req (access.Prover.Principal).
func (m *Manager) principal(req Request) string { return m.access.Principal(req.Spec, req.Creds) }

// prove shows that req's caller reads the data of the dataset version in dir (access.Prover.Prove).
func (m *Manager) prove(ctx context.Context, req Request, dir string, md *cache.Meta, digest string) error {
	open := func() (source.Source, error) { return m.openSource(req) }
	return m.access.Prove(ctx, m.principal(req), open, req.Spec, dir, md, digest)
}

// callerAccess proves a staging's own caller for its job (stage.Access).
type callerAccess struct {
	m   *Manager
	req Request
	who string
}

func (a *callerAccess) Prove(ctx context.Context, dir string, md *cache.Meta, digest string) error {
	return a.m.prove(ctx, a.req, dir, md, digest)
}

// ProveFiles shows that the caller may read every file, so that bytes peers serve it are bytes
// it may have; the proof is remembered as a hit's is.
func (a *callerAccess) ProveFiles(ctx context.Context, src source.Source, dir string, md *cache.Meta) error {
	err := a.m.access.ReadsEvery(ctx, src, dir, md)
	switch {
	case err == nil:
		a.m.access.Remember(md.Digest, a.who)
	case source.KindOf(err) == source.Denied:
		a.m.access.RememberDenial(md.Digest, a.who, err)
	}
	return err
}

func failKey(pool, id, principal string) string { return jobKey(pool, id) + "\x00" + principal }

// checking is the progress reported while a caller's access proof is still under way.
func checking(spec *Spec) Status { return Status{Dataset: spec.Source, Phase: PhaseListing} }

func (m *Manager) ensure(ctx context.Context, req Request) (Status, *staging, error) {
	if req.Spec == nil {
		return Status{}, nil, source.Errorf(source.Invalid, "no dataset spec")
	}
	if err := m.admit(req.Spec); err != nil {
		return Status{}, nil, fmt.Errorf("%s: %w", req.Spec.Describe(), err)
	}
	// The caller's endpoint policy holds on every path, also those that dial nothing (a join,
	// a remembered proof): a refused endpoint is refused here.
	if _, err := m.egressPolicy(req.Spec); err != nil {
		return Status{}, nil, err
	}
	id := req.Spec.ID()
	who := m.principal(req)
	m.cache.AddPool(req.Pool)
	dir := cache.DatasetDir(req.Pool, id)
	key := jobKey(req.Pool, id)
	fkey := failKey(req.Pool, id, who)
	logger := klog.FromContext(ctx).WithValues("dataset", req.Spec.String(), "datasetID", id, "pool", req.Pool)

	pl := m.cache.Lock(req.Pool)
	for kept := 0; ; {
		pl.Lock()
		m.mu.Lock()
		js := slices.Clone(m.jobs[key])
		ferr, failed := m.failed[fkey]
		if failed && len(js) == 0 {
			delete(m.failed, fkey)
		}
		m.mu.Unlock()

		if len(js) > 0 {
			pl.Unlock()
			st, j, again, err := m.joinOrBeside(ctx, logger, req, js, who)
			if again {
				continue
			}
			return st, j, err
		}
		if failed {
			pl.Unlock()
			m.cache.Changed()
			return Status{Dataset: req.Spec.Source, Phase: PhaseFailed}, nil, ferr
		}
		// Every ready version is the caller's to be served if it proves it reads it; after a
		// version was moved aside for this caller, only a current one staged meanwhile is new.
		if vs := cache.ReadyVersions(req.Pool, id); len(vs) > 0 && (kept == 0 || cache.IsReady(dir)) {
			pl.Unlock()
			m.cache.Changed()
			st, err := m.hit(ctx, req, vs)
			if !errors.Is(err, access.ErrListingDiffers) {
				return st, nil, err
			}
			if kept++; kept > 2 {
				return Status{}, nil, fmt.Errorf("%s: %w", req.Spec.Describe(), source.Wrap(source.Retryable, err, "other versions are being staged meanwhile; retry"))
			}
			// The caller sees other data than every version here: the source changed, or the
			// caller's credentials resolve to other data. It gets a staging of what it sees, beside
			// the versions here, which stay for the callers who see them.
			logger.Info("cached versions differ from the caller's listing; staging a new version", "versions", len(vs))
			if err := m.cache.Keep(req.Pool, id, vs[0].Digest, m.limits.MaxVersions); err != nil {
				return Status{}, nil, fmt.Errorf("%s: %w", req.Spec.Describe(), err)
			}
			continue
		}
		return m.startStaging(logger, req, pl, key, who, dir)
	}
}

// hit serves a ready cached version to a caller that proves it reads that version's data: the
// one its remembered proof names, or the one its own listing equals (access.Prover.ProveAny).
func (m *Manager) hit(ctx context.Context, req Request, vs []cache.Version) (Status, error) {
	open := func() (source.Source, error) { return m.openSource(req) }
	v, err := m.access.ProveAny(ctx, m.principal(req), open, req.Spec, vs)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return checking(req.Spec), nil
		}
		return Status{}, fmt.Errorf("%s: %w", req.Spec.Describe(), err)
	}
	md := v.Meta
	if err := checkCapacity(req, md.Bytes, md.Alloc, true); err != nil {
		return Status{}, fmt.Errorf("%s: %w", req.Spec.Describe(), err)
	}
	cache.Touch(v.Dir)
	m.metrics.cacheHits.Inc()
	return Status{Dataset: req.Spec.Source, Phase: PhaseReady, BytesDone: md.Bytes, BytesTotal: md.Bytes,
		ObjectsDone: md.Objects, ObjectsTotal: md.Objects, CacheHit: true, Version: v.Digest}, nil
}

// admit refuses what this caller may not name: an NFS server that inline volumes may not reach.
func (m *Manager) admit(spec *Spec) error {
	if spec.Inline && spec.Scheme == SchemeNFS && !slices.Contains(m.cfg.NFSServers, spec.Host) {
		return source.Errorf(source.Denied, "NFS server %s is not allowed in inline volumes (the administrator allows servers with --nfs-servers)", spec.Host)
	}
	return nil
}

func (m *Manager) runJob(logger klog.Logger, key string, j *staging) {
	start := time.Now()
	err := j.Run(klog.NewContext(m.base, logger))
	j.Close()
	if j.beside {
		err = m.settleBeside(j, err)
	}
	m.mu.Lock()
	m.jobs[key] = slices.DeleteFunc(m.jobs[key], func(o *staging) bool { return o == j })
	if len(m.jobs[key]) == 0 {
		delete(m.jobs, key)
	}
	if err != nil {
		m.failed[key+"\x00"+j.principal] = err
		m.recordFailureLocked(key, j.Spec(), err, time.Now())
	}
	m.mu.Unlock()
	j.unpin()
	j.err = err
	close(j.done)
	m.cache.Changed()
	st := j.Status()
	if err != nil {
		m.metrics.stagings.WithLabelValues("failed").Inc()
		logger.Error(err, "staging failed", "permanent", source.IsPermanent(err), "bytesDone", st.BytesDone)
		return
	}
	// Every object was read with the stager's credentials, pinned to the manifest.
	m.access.Remember(st.Version, j.principal)
	m.metrics.stagings.WithLabelValues("ready").Inc()
	m.metrics.stagedBytes.Add(float64(st.BytesTotal))
	logger.Info("dataset ready", "bytes", st.BytesTotal, "objects", st.ObjectsTotal, "duration", time.Since(start))
	m.cache.Evict(m.base, j.Pool(), 0)
}

// checkCapacity refuses a dataset that cannot fit req's volume (stage.CheckCapacity).
func checkCapacity(req Request, bytes, alloc int64, complete bool) error {
	return stage.CheckCapacity(req.Capacity, bytes, alloc, complete)
}

func (m *Manager) openSource(req Request) (source.Source, error) {
	s := req.Spec
	switch s.Scheme {
	case SchemeS3:
		policy, err := m.egressPolicy(s)
		if err != nil {
			return nil, err
		}
		tlsCfg, err := m.s3TLS(s)
		if err != nil {
			return nil, err
		}
		return s3source.New(s3source.Config{
			Bucket: s.Bucket, Prefix: s.Prefix, Endpoint: s.Endpoint, Region: s.Region, PathStyle: s.PathStyle,
			AccessKeyID: req.Creds.AccessKeyID, SecretAccessKey: req.Creds.SecretAccessKey,
			SessionToken: req.Creds.SessionToken, WebIdentity: m.webIdentity(req.Creds),
			MaxConns: m.cfg.Concurrency, Egress: policy, TLS: tlsCfg, MaxListed: m.limits.MaxObjects,
		})
	case SchemeNFS:
		if s.NFSVersion == consts.NFSVersion4 {
			return nfs4source.New(nfs4source.Config{Host: s.Host, Path: s.Path, UID: m.nfsUID, GID: m.nfsGID, MaxIdle: m.cfg.Concurrency})
		}
		return nfssource.New(s.Host, s.Path, m.nfsUID, m.nfsGID)
	case SchemeLocal:
		return localsource.New(s.Path, m.cfg.LocalSourceRoots)
	}
	return nil, source.Errorf(source.Invalid, "unsupported scheme %q", s.Scheme)
}

// TreePath returns the ready dataset's directory on pool. It proves nothing of the caller: volumes
// get the tree from Acquire, after Wait proved the caller may read it.
func (m *Manager) TreePath(pool string, spec *Spec) (string, error) {
	return m.cache.TreePath(pool, spec)
}

// Acquire records that volumeID uses the dataset's tree on pool (a read-only bind mount) and
// returns the tree's path. version is the Status.Version the caller proved it may read (empty: any);
// a dataset replaced since is refused as changed, and the caller asks again. The reference is a
// file, so it survives driver restarts; ReleaseID removes it. Both are idempotent.
func (m *Manager) Acquire(pool string, spec *Spec, version, volumeID string) (string, error) {
	return m.cache.Acquire(pool, spec, version, volumeID)
}

// ReleaseID drops volumeID's reference to the dataset id on pool. The reference may be in a
// retired version, which goes with its last reference.
func (m *Manager) ReleaseID(pool, id, volumeID string) error {
	return m.cache.Release(pool, id, volumeID)
}

// Referenced returns the tree of the version of dataset id on pool that holder references; see
// cache.Cache.Referenced.
func (m *Manager) Referenced(pool, id, holder string) (string, error) {
	return m.cache.Referenced(pool, id, holder)
}

// Share references, for to, the version of dataset id on pool that from references; see
// cache.Cache.Share.
func (m *Manager) Share(pool, id, from, to string) (string, error) {
	return m.cache.Share(pool, id, from, to)
}

// Populate copies the ready dataset version on pool, which the caller proved it may read, into
// target, once; see cache.Cache.Populate.
func (m *Manager) Populate(ctx context.Context, pool string, spec *Spec, version, target string) error {
	return m.cache.Populate(ctx, pool, spec, version, target)
}

// Populated reports whether the filesystem at target was already filled with spec's dataset.
func Populated(target string, spec *Spec) bool { return cache.Populated(target, spec) }

// evicted counts an eviction and tells the driver.
func (m *Manager) evicted(e EvictEvent) {
	m.metrics.evictions.WithLabelValues(e.Pool).Inc()
	m.metrics.evictedBytes.WithLabelValues(e.Pool).Add(float64(e.Bytes))
	if m.cfg.OnEvict != nil {
		m.cfg.OnEvict(e)
	}
}

// Inventory reads what the cache of pool (a directory) holds, listing at most limit datasets
// (0: all), with the stagings under way and the kinds of failed attempts.
func (m *Manager) Inventory(pool string, limit int) (Inventory, error) {
	return m.cache.Inventory(pool, limit, func(byID map[string]*CachedDataset) { m.overlay(pool, byID) })
}

// InventoryGeneration returns the inventory generation and a channel closed when it next moves:
// a dataset starts, is listed, finishes, fails, is evicted, used or released, and every
// Config.ProgressInterval while one is being staged.
func (m *Manager) InventoryGeneration() (uint64, <-chan struct{}) { return m.cache.Generation() }

// Run evicts on every pool periodically until ctx ends, then stops the staging jobs.
func (m *Manager) Run(ctx context.Context) {
	defer m.stop()
	t := time.NewTicker(m.cfg.EvictInterval)
	defer t.Stop()
	go m.watchProgress(ctx.Done(), m.cfg.ProgressInterval)
	for {
		for _, p := range m.cache.Pools() {
			m.cache.Evict(ctx, p, 0)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Status reports a dataset's state on pool without starting anything: the progress of a staging
// under way, or Ready when cached. ok is false when the pool knows nothing of it. Failures are not
// reported here: each is told to the caller whose attempt failed, and to no other tenant.
func (m *Manager) Status(pool string, spec *Spec) (Status, bool, error) {
	id := spec.ID()
	m.mu.Lock()
	js := m.jobs[jobKey(pool, id)]
	m.mu.Unlock()
	if len(js) > 0 {
		return js[0].Status(), true, nil
	}
	vs := cache.ReadyVersions(pool, id)
	if len(vs) == 0 {
		return Status{}, false, nil
	}
	md := vs[0].Meta
	return Status{Dataset: spec.Source, Phase: PhaseReady, BytesDone: md.Bytes, BytesTotal: md.Bytes,
		ObjectsDone: md.Objects, ObjectsTotal: md.Objects}, true, nil
}

// Have implements peer.Store: what this node holds of a dataset version (peer.CacheStore).
func (m *Manager) Have(id, digest string) (*peer.Have, bool) { return m.store.Have(id, digest) }

// Open implements peer.Store: bytes of an entry this node holds (peer.CacheStore).
func (m *Manager) Open(id, digest string, r, off, n int64) (io.ReadCloser, error) {
	return m.store.Open(id, digest, r, off, n)
}

// Versions implements peer.Store: the versions of dataset id this node holds or stages
// (peer.CacheStore).
func (m *Manager) Versions(id string) []string { return m.store.Versions(id) }

// stagingVersions lists the digests of the stagings under way of dataset id whose entries are
// named for peers.
func (m *Manager) stagingVersions(id string) []string {
	var out []string
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, js := range m.jobs {
		for _, j := range js {
			if md := j.Meta(); j.ID() == id && j.Spec().Scheme == SchemeS3 && j.Peering() != nil && md != nil {
				out = append(out, md.Digest)
			}
		}
	}
	return out
}

// stagingVersion is the staging under way of a version whose entries are named for peers.
func (m *Manager) stagingVersion(id, digest string) *peer.Staging {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, js := range m.jobs {
		for _, j := range js {
			if j.ID() != id || j.Spec().Scheme != SchemeS3 {
				continue
			}
			st := j.Peering()
			if md := j.Meta(); st != nil && md != nil && md.Digest == digest {
				return st
			}
		}
	}
	return nil
}
