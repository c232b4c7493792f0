// Package stage is the staging engine: a Job lists a dataset's source into a manifest, fetches
// every entry (whole, or in parallel ranges; from the source or, through package peer, from other
// nodes), verifies it against the checksums the source gave, commits it into staging/, and
// publishes the tree. The Engine holds what all jobs of a node share: read slots, the bandwidth
// limit, per-source slots, metrics. A job sees the cache (Cache) and the peers (Peers) through
// small interfaces; it proves no caller's access (package access) and hands out nothing (package
// datasource, the coordinator, does).
package stage

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"github.com/cistern-csi/cistern/pkg/datasource/dataset"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/pkg/units"
)

// Cache is what a job needs of the node's cache besides the dataset directory it writes:
// room in the pool, and telling the inventory that it changed.
type Cache interface {
	// MakeRoom makes sure pool can take the rest of the dataset in dir (alloc bytes in all),
	// evicting unused datasets, or says why it cannot.
	MakeRoom(ctx context.Context, pool, dir string, alloc int64) error
	// Changed records that the inventory would now read differently.
	Changed()
	// Discard takes away the directory of a staging that cannot go on: deleted, or retired
	// while volumes reference it (streaming volumes read what it committed, held by
	// descriptor), never left for another version to be staged in place.
	Discard(pool, dir string) error
}

// Peers is the node's peer network as a job sees it (peer.Network).
type Peers interface {
	// Self is this node's name.
	Self() string
	// HasPeers reports whether another node holds or stages the dataset.
	HasPeers(id string) bool
	// Swarm starts asking the peers of a dataset version what they hold.
	Swarm(ctx context.Context, id, digest string) *peer.Swarm
}

// Access proves, with its own credentials, the caller a job stages for, as the coordinator proves
// every caller (package access): before a job resumes what an earlier attempt left, and before it
// takes bytes from peers.
type Access interface {
	// Prove shows that the caller reads the data of the manifest in dir: its listing matches
	// (digest), and it may read every file.
	Prove(ctx context.Context, dir string, md *cache.Meta, digest string) error
	// ProveFiles shows that src's credentials may read every file of the manifest in dir, and
	// remembers the outcome as a proof.
	ProveFiles(ctx context.Context, src source.Source, dir string, md *cache.Meta) error
}

// Metrics are the counters staging moves.
type Metrics struct {
	// Retries counts source reads retried after a transient failure.
	Retries prometheus.Counter
	// Fetched counts bytes read, by dataset ID and origin (OriginSource, OriginPeer).
	Fetched *prometheus.CounterVec
	// WrongPieces counts pieces from peers that failed verification.
	WrongPieces prometheus.Counter
	// Verified counts files staged from a source, by the check their bytes passed (Checked*).
	Verified *prometheus.CounterVec
}

// What a staged file's bytes were checked against: the source's full-object checksum (its
// algorithm, lower case: crc32, crc32c, crc64nvme, sha256), the MD5 ETag of a single-part
// object, the part MD5s of a multipart ETag, or nothing the source gave (CheckedNone).
const (
	CheckedMD5          = "md5"
	CheckedMultipartMD5 = "multipart-md5"
	CheckedNone         = "none"
)

// verified counts one staged file under the check it passed.
func (m Metrics) verified(check string) {
	if m.Verified != nil {
		m.Verified.WithLabelValues(check).Inc()
	}
}

// Origins of fetched bytes.
const (
	OriginSource = "source"
	OriginPeer   = "peer"
)

// Config configures an Engine.
type Config struct {
	// Concurrency bounds parallel reads across all datasets on the node.
	Concurrency int
	// BandwidthBytesPerSec caps staging throughput across the node; 0 is unlimited.
	BandwidthBytesPerSec int64
	// ChunkSize is the size of a ranged read of a large object.
	ChunkSize int64
	// Retries is how often a retryable read is attempted before the attempt fails.
	Retries int
	// Limits bound what one dataset may make the node spend.
	Limits dataset.Limits
	// Listings bound the listings under way on the node, stagings' and proofs' alike.
	Listings *dataset.ListingSlots
	Cache    Cache
	// Peers, when set, lets jobs read S3 datasets from other nodes; nil reads the source only.
	Peers   Peers
	Metrics Metrics
	// Unverifiable decides what becomes of an entry of dataset id that nothing can check (err,
	// of kind source.Unverifiable, says why): nil serves it unchecked, an error refuses it and
	// fails the staging. nil refuses every such entry.
	Unverifiable func(ctx context.Context, id string, obj source.Object, err error) error
}

// Engine runs the staging jobs of a node within its shared limits.
type Engine struct {
	cfg     Config
	slots   chan struct{}
	limiter *rate.Limiter

	mu sync.Mutex
	// perSource holds the concurrency slots of each source endpoint.
	perSource map[string]chan struct{}
}

// NewEngine returns an engine; cfg's fields are set (the coordinator fills defaults).
func NewEngine(cfg Config) *Engine {
	e := &Engine{cfg: cfg, slots: make(chan struct{}, cfg.Concurrency), perSource: map[string]chan struct{}{}}
	if cfg.BandwidthBytesPerSec > 0 {
		burst := int(min(max(cfg.BandwidthBytesPerSec/10, copyBufSize), 1<<30))
		e.limiter = rate.NewLimiter(rate.Limit(cfg.BandwidthBytesPerSec), burst)
	}
	return e
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
		units.HumanBytes(s.BytesDone), units.HumanBytes(s.BytesTotal), s.ObjectsDone, s.ObjectsTotal,
		100*float64(s.BytesDone)/float64(max(s.BytesTotal, 1)))
}

// CheckCapacity refuses a dataset whose files take more than capacity, the volume's room (0: no
// check); complete is false while the listing is still counting. Callers prefix the dataset's
// name.
func CheckCapacity(capacity, bytes, alloc int64, complete bool) error {
	if capacity <= 0 || bytes == 0 && alloc == 0 {
		return nil
	}
	if alloc > capacity {
		atLeast := ""
		if !complete {
			atLeast = "at least "
		}
		return source.Errorf(source.TooLarge, "it holds %s%s (%s on disk), more than the %s the volume has room for",
			atLeast, units.HumanBytes(bytes), units.HumanBytes(alloc), units.HumanBytes(capacity))
	}
	return nil
}

// errAbandoned ends a staging nobody waits for any more.
var errAbandoned = source.Errorf(source.Invalid, "staging abandoned: no volume asked for it any more")

// errTooSlow ends a read slower than the minimum throughput; it is retried like any failed read.
var errTooSlow = errors.New("read slower than the minimum throughput")

// sourceSlots returns the concurrency slots of spec's source endpoint.
func (e *Engine) sourceSlots(spec *dataset.Spec) chan struct{} {
	key := dataset.SourceKey(spec)
	e.mu.Lock()
	defer e.mu.Unlock()
	ch := e.perSource[key]
	if ch == nil {
		ch = make(chan struct{}, e.cfg.Limits.PerSource)
		e.perSource[key] = ch
	}
	return ch
}

// watchInterest cancels the job when nobody asked for it in AbandonAfter and no streaming
// volume reads from it.
func (j *Job) watchInterest(ctx context.Context, cancel context.CancelCauseFunc) {
	after := j.e.cfg.Limits.AbandonAfter
	_ = wait.PollUntilContextCancel(ctx, min(after/4, time.Minute), false, func(context.Context) (bool, error) {
		if j.serving.Load() > 0 || time.Since(time.Unix(0, j.wanted.Load())) <= after {
			return false, nil
		}
		cancel(errAbandoned)
		return true, nil
	})
}
