package stage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"github.com/cistern-csi/cistern/pkg/datasource/dataset"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// Job stages one dataset into one pool's cache. Memory stays bounded whatever the dataset size:
// the manifest is streamed from disk, and each worker holds one copy buffer.
type Job struct {
	e        *Engine
	access   Access
	spec     *dataset.Spec
	capacity int64  // the volume's size; a dataset that cannot fit is refused (0: no check)
	id       string // spec.ID(), which hashes the spec
	pool     string
	dir      string
	src      source.Source
	root     *os.Root // dir; every write goes through it, so no path can leave the dataset

	phase                                      atomic.Value
	bytesDone, bytesTotal, objsDone, objsTotal atomic.Int64
	alloc                                      atomic.Int64
	// listed is closed once the manifest is taken: the dataset's size is known.
	listed chan struct{}

	dirs *dirCache
	tmp  [cache.TmpShards]*dir
	// resuming is set when staging/ already held files at start.
	resuming bool
	// proved is the manifest an earlier attempt left that this job's caller proved it reads
	// (setAside), resumed without a second proof.
	proved *cache.Meta
	// wanted is when a caller last asked for the dataset (UnixNano); see Limits.AbandonAfter.
	wanted atomic.Int64
	// serving counts the streaming volumes served from the job (Serve): while one is, the job
	// is wanted.
	serving atomic.Int64
	// sourceSlots bound the node's reads from the job's source endpoint.
	sourceSlots chan struct{}
	// md is the committed manifest's cache.Meta, set before listed is closed.
	md atomic.Pointer[cache.Meta]
	// started is when the job was created (the inventory's last use of a new dataset).
	started time.Time

	bigMu sync.Mutex
	big   []*bigFile

	// peers is the job's sharing with other nodes (sharing.go).
	peers sharing
	// prefer is what streaming reads wait for (prefer.go).
	prefer preferring
}

// New returns a job that stages spec, read through src, into dir, the dataset's directory in
// pool's cache; Run runs it. capacity is the volume's size (0: no check); acc proves the caller
// whose credentials src holds.
func (e *Engine) New(spec *dataset.Spec, capacity int64, pool, dir string, src source.Source, acc Access) *Job {
	j := &Job{e: e, access: acc, spec: spec, capacity: capacity, id: spec.ID(), pool: pool, dir: dir, src: src, listed: make(chan struct{}),
		sourceSlots: e.sourceSlots(spec), started: time.Now()}
	j.phase.Store(PhaseListing)
	j.Want()
	return j
}

// Want records that a caller asked for the dataset (Limits.AbandonAfter).
func (j *Job) Want() { j.wanted.Store(time.Now().UnixNano()) }

// Serve records a streaming volume served from the job: the job is not abandoned while the
// volume reads from it, even when its reads never reach the plugin (passed through to the
// cache's files) and nobody calls again. The returned func ends it, and counts as a want.
func (j *Job) Serve() (done func()) {
	j.serving.Add(1)
	var once sync.Once
	return func() {
		once.Do(func() {
			j.Want()
			j.serving.Add(-1)
		})
	}
}

// Listed is closed once the manifest is taken: the dataset's size and version are known.
func (j *Job) Listed() <-chan struct{} { return j.listed }

// Alloc is what the dataset takes in a filesystem, as far as it is listed.
func (j *Job) Alloc() int64 { return j.alloc.Load() }

// ID is the dataset's ID.
func (j *Job) ID() string { return j.id }

// Pool is the pool directory the job stages into.
func (j *Job) Pool() string { return j.pool }

// Dir is the dataset's directory in the pool's cache.
func (j *Job) Dir() string { return j.dir }

// Spec is the dataset the job stages.
func (j *Job) Spec() *dataset.Spec { return j.spec }

// Started is when the job was created.
func (j *Job) Started() time.Time { return j.started }

// Meta is the committed manifest's meta; nil until Listed is closed.
func (j *Job) Meta() *cache.Meta { return j.md.Load() }

// Close closes the job's source.
func (j *Job) Close() error { return j.src.Close() }

// Peering is what the job serves peers while it stages: nil until its entries are named.
func (j *Job) Peering() *peer.Staging {
	n := j.peers.names.Load()
	if n == nil {
		return nil
	}
	return &peer.Staging{Dir: j.dir, Holding: &j.peers.holding, Names: n}
}

// IsListed reports whether the manifest is taken, so that bytesTotal is the dataset's size.
func (j *Job) IsListed() bool {
	select {
	case <-j.listed:
		return true
	default:
		return false
	}
}

// Status is the job's progress.
func (j *Job) Status() Status {
	st := Status{
		Dataset: j.spec.Source, Phase: j.phase.Load().(Phase),
		BytesDone: j.bytesDone.Load(), BytesTotal: j.bytesTotal.Load(),
		ObjectsDone: j.objsDone.Load(), ObjectsTotal: j.objsTotal.Load(),
	}
	if md := j.md.Load(); md != nil {
		st.Version = md.Digest
	}
	return st
}

// Manifest returns the committed manifest's meta and digest; only once Listed is closed.
func (j *Job) Manifest() (*cache.Meta, string) {
	md := j.md.Load()
	return md, md.Digest
}

func (j *Job) describe() string { return j.spec.Describe() }

// Run stages the dataset until it is ready, fails, or ctx ends.
func (j *Job) Run(ctx context.Context) (err error) {
	ctx, cancelDeadline := context.WithTimeoutCause(ctx, j.e.cfg.Limits.JobDeadline,
		source.Errorf(source.Retryable, "staging took longer than %s", j.e.cfg.Limits.JobDeadline))
	defer cancelDeadline()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go j.watchInterest(ctx, cancel)
	defer func() {
		if err != nil {
			err = j.failed(ctx, err)
		}
	}()
	if err := j.setAside(ctx); err != nil {
		return err
	}
	closeDirs, err := j.openDirs()
	if err != nil {
		return err
	}
	defer closeDirs()
	md, err := j.list(ctx)
	if err != nil {
		return err
	}
	if err := j.e.cfg.Cache.MakeRoom(ctx, j.pool, j.dir, md.Alloc); err != nil {
		return err
	}
	if j.e.cfg.Peers != nil && j.spec.Scheme == dataset.SchemeS3 {
		leave, err := j.joinPeers(ctx, md)
		if err != nil {
			return err
		}
		defer leave()
	}
	j.phase.Store(PhaseFetching)
	stop := j.logProgress(ctx, klog.FromContext(ctx))
	err = j.fetchAll(ctx)
	j.peers.fetched.Store(true)
	stop()
	if err != nil {
		return err
	}
	j.phase.Store(PhaseSyncing)
	if err := j.finish(ctx, md); err != nil {
		return err
	}
	j.phase.Store(PhaseReady)
	return nil
}

// failed is the error a failed attempt ends with: the deadline or abandonment rather than the
// read it interrupted, and the dataset named. A dataset that cannot be staged leaves nothing.
func (j *Job) failed(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
		err = cause // the deadline or abandonment, not the read it interrupted
	}
	j.phase.Store(PhaseFailed)
	if errors.Is(err, errAbandoned) || ctx.Err() == nil && source.IsPermanent(err) {
		// Nothing is left behind of a dataset that cannot be staged, but what streaming
		// volumes still read (retired).
		if rerr := j.e.cfg.Cache.Discard(j.pool, j.dir); rerr != nil {
			klog.FromContext(ctx).Error(rerr, "cleaning up failed dataset")
		}
	}
	return fmt.Errorf("%s: %w", j.describe(), err)
}

// openDirs makes the dataset's directories and opens its root; the returned func closes what it
// opened.
func (j *Job) openDirs() (closeAll func(), err error) {
	// The cache is root's: volumes reach a dataset through bind mounts, never through this path.
	if err := os.MkdirAll(cache.Dir(j.pool), 0o700); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(j.dir, 0o755); err != nil {
		return nil, err
	}
	if j.root, err = os.OpenRoot(j.dir); err != nil {
		return nil, err
	}
	j.dirs = newDirCache(j.root)
	closeAll = func() {
		j.closeBig()
		j.dirs.close()
		j.root.Close()
	}
	if err := j.prepare(); err != nil {
		closeAll()
		return nil, err
	}
	return closeAll, nil
}

// prepare clears partial downloads and makes tmp/'s shards and staging/.
func (j *Job) prepare() error {
	// Partial downloads are discarded; files already in staging/ were verified and are kept.
	if err := os.RemoveAll(filepath.Join(j.dir, cache.TmpDir)); err != nil {
		return err
	}
	// A staging/ that already holds files is a resume: each file is checked before fetching.
	if ents, err := os.ReadDir(filepath.Join(j.dir, cache.StagingDir)); err == nil && len(ents) > 0 {
		j.resuming = true
	}
	// Temporary files are spread over shards: one directory taking every create and rename is a
	// point of contention with many small objects.
	for k := range cache.TmpShards {
		var err error
		if j.tmp[k], err = j.dirs.mkdir(path.Join(cache.TmpDir, strconv.Itoa(k))); err != nil {
			return err
		}
	}
	if err := j.mkdirs(cache.StagingDir); err != nil {
		return err
	}
	if f, err := j.root.OpenFile(cache.LastUsedFile, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
		f.Close()
	}
	return nil
}

// list takes the manifest (manifest.go), refuses a dataset that cannot fit, and tells the
// callers waiting for its size.
func (j *Job) list(ctx context.Context) (*cache.Meta, error) {
	listStart := time.Now()
	md, err := j.manifest(ctx)
	if err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(2).Info("dataset listed", "objects", md.Objects, "bytes", md.Bytes, "duration", time.Since(listStart))
	j.bytesTotal.Store(md.Bytes)
	j.objsTotal.Store(md.Objects)
	j.alloc.Store(md.Alloc)
	if err := CheckCapacity(j.capacity, md.Bytes, md.Alloc, true); err != nil {
		return nil, err
	}
	j.md.Store(md)
	j.prefer.init(md.Objects)
	close(j.listed)
	j.e.cfg.Cache.Changed()
	return md, nil
}

// joinPeers names the manifest's entries for peers, so that the staging is served to them as it
// goes (peer.CacheStore), and joins the swarm of the nodes that hold or stage the dataset: at
// once when the inventory lists one, or as soon as it does while the job fetches (watchPeers).
// The returned func leaves it.
func (j *Job) joinPeers(ctx context.Context, md *cache.Meta) (leave func(), err error) {
	c, err := peer.BuildNames(filepath.Join(j.dir, cache.ObjectsFile))
	if err != nil {
		return nil, err
	}
	j.peers.names.Store(c)
	j.peers.self, j.peers.entries = j.e.cfg.Peers.Self(), md.Objects
	j.peers.joined = make(chan struct{})
	if j.e.cfg.Peers.HasPeers(j.id) {
		if err := j.join(ctx, ctx, md); err != nil {
			return nil, err
		}
		return j.peers.sw().Close, nil
	}
	wctx, stop := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() { defer close(watched); j.watchPeers(wctx, ctx, md) }()
	return func() {
		stop()
		<-watched
		if sw := j.peers.sw(); sw != nil {
			sw.Close()
		}
	}, nil
}

// peerWatchInterval is how often a job that knows no peer asks the inventory again while it
// fetches. Nodes that start together learn of each other only once their StoragePools report the
// dataset (about a second later): checked once, at listing, they never fanned out (2 GiB × 4
// nodes all Ready in 3.49 the time of one node, docs/benchmarks.md, "Peer fan-out").
const peerWatchInterval = 250 * time.Millisecond

// watchPeers joins the swarm once the inventory lists a peer of the dataset, until the job has
// fetched everything or ctx ends. A failed join leaves the job reading from the source alone.
func (j *Job) watchPeers(ctx, jobCtx context.Context, md *cache.Meta) {
	t := time.NewTicker(peerWatchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if j.peers.fetched.Load() {
			return
		}
		if !j.e.cfg.Peers.HasPeers(j.id) {
			continue
		}
		if err := j.join(ctx, jobCtx, md); err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).V(2).Info("staging without peers: joining them failed", "err", err)
		}
		return
	}
}

// join joins the swarm of the dataset's peers, which polls them until jobCtx ends, once one
// round of asking them what they hold is over (bounded by the network's timeout). The caller's
// own credentials read the data before any peer is asked: its listing gave the manifest, and it
// may read every file of it, as a cache hit proves access (package access). A caller that may
// list but not read, or read only some files, gets nothing from peers.
func (j *Job) join(ctx, jobCtx context.Context, md *cache.Meta) error {
	if err := j.access.ProveFiles(ctx, j.src, j.dir, md); err != nil {
		return err
	}
	sw := j.e.cfg.Peers.Swarm(jobCtx, j.id, md.Digest)
	select {
	case <-sw.Polled():
	case <-ctx.Done():
		sw.Close()
		return context.Cause(ctx)
	}
	j.peers.swarm.Store(sw)
	close(j.peers.joined)
	klog.FromContext(ctx).V(2).Info("joined the dataset's peers", "members", sw.Members(), "after", time.Since(j.started))
	j.setStreams()
	go j.resizeStreams(jobCtx, sw)
	return nil
}

// resizeStreams sets the large entries' stream bounds again after each round of the swarm's
// polls, as members start and stop reading from the source, until jobCtx ends.
func (j *Job) resizeStreams(ctx context.Context, sw *peer.Swarm) {
	for {
		select {
		case <-sw.Polled():
			j.setStreams()
		case <-ctx.Done():
			return
		}
	}
}

// setStreams sets, for each large entry, the ranges read from the source at once to what a node
// of the swarm reads (streamsPerObject): lower once the job joins its swarm, so that each node's
// ranges finish one after another ("The large object's tail", docs/benchmarks.md), and higher
// again as other members finish reading. Ranges under way go on; no new one starts until fewer
// run. (Taking the spare streams by waiting for them queued the takers behind the tasks already
// waiting, so a node could go on starting up to four ranges at once well after it joined.)
func (j *Job) setStreams() {
	j.bigMu.Lock()
	defer j.bigMu.Unlock()
	for _, b := range j.big {
		b.streams.setLimit(j.streamsPerObject())
	}
}

func (j *Job) logProgress(ctx context.Context, logger klog.Logger) func() {
	ctx, cancel := context.WithCancel(ctx)
	go wait.PollUntilContextCancel(ctx, 10*time.Second, false, func(context.Context) (bool, error) {
		st := j.Status()
		logger.Info("staging progress", "bytesDone", st.BytesDone, "bytesTotal", st.BytesTotal,
			"objectsDone", st.ObjectsDone, "objectsTotal", st.ObjectsTotal)
		return false, nil
	})
	return cancel
}
