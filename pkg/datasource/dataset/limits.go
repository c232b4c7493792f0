package dataset

import (
	"strings"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/pkg/units"
)

// Limits bound what one dataset may make the node spend. Any pod author can name a dataset (an
// inline volume), so each is an administrator's limit with a safe default; the driver's flags
// set them.
type Limits struct {
	// MaxBytes and MaxObjects bound a dataset's size and its number of entries (files,
	// directories, links; an empty file still takes an inode and a manifest line).
	MaxBytes   int64
	MaxObjects int64
	// MaxKeyLength (bytes) and MaxKeyDepth (path segments) bound each entry's key.
	MaxKeyLength int
	MaxKeyDepth  int
	// MaxManifestBytes bounds the manifest written to the pool.
	MaxManifestBytes int64
	// MinThroughput (bytes/s) and ReadGrace bound one read of an object or range: it must finish
	// within ReadGrace + size/MinThroughput, or it is cancelled and retried like a failed read.
	MinThroughput int64
	ReadGrace     time.Duration
	// JobDeadline bounds one staging attempt from start to ready.
	JobDeadline time.Duration
	// AbandonAfter cancels a staging nobody asked for in that long (its volumes deleted, its
	// pods gone: kubelet retries a pending mount every two minutes at most) and deletes what
	// it staged.
	AbandonAfter time.Duration
	// PerSource bounds the node's concurrent reads from one source endpoint (an S3 endpoint,
	// an NFS server), so one slow server cannot hold every staging slot.
	PerSource int
	// Listings, ListingsPerSource and ListingsPerNamespace bound the listings (stagings' and
	// access proofs') under way on the node, against one source endpoint (SourceKey), and for
	// the callers of one namespace (Spec.Namespace): each holds a CPU and a connection for as
	// long as the source keeps answering, and any pod author can start one.
	Listings, ListingsPerSource, ListingsPerNamespace int
	// ListingMinRate (entries a second) and ListingRateWindow: a listing that goes through
	// fewer than ListingMinRate × ListingRateWindow entries (keys, and S3 common prefixes) in
	// any window of its slots loses them, with a Retryable error: a server that trickles or
	// stalls its answers holds a slot for one window, not for as long as it likes.
	ListingMinRate    float64
	ListingRateWindow time.Duration
	// MaxGlobWork bounds the include/exclude matching one listing may do, in units of pattern
	// bytes times key bytes (source.Work).
	MaxGlobWork int64
	// MaxVersions bounds the ready versions of one dataset a pool keeps side by side (callers
	// whose listings differ each get the version they see); past it the least recently used
	// unused version goes. Versions in use are never deleted. It bounds the stagings of one
	// dataset under way at once on a pool too (versions staged side by side).
	MaxVersions int
}

// DefaultLimits are the limits a zero Config field gets, and the driver flags' defaults.
var DefaultLimits = Limits{
	MaxBytes:          1 << 40,
	MaxObjects:        5_000_000,
	MaxKeyLength:      1024,
	MaxKeyDepth:       64,
	MaxManifestBytes:  1 << 30,
	MinThroughput:     64 << 10,
	ReadGrace:         time.Minute,
	JobDeadline:       24 * time.Hour,
	AbandonAfter:      15 * time.Minute,
	Listings:          8,
	ListingsPerSource: 2,
	ListingMinRate:    10,
	ListingRateWindow: time.Minute,
	MaxGlobWork:       1 << 36,
	MaxVersions:       4,
}

// WithDefaults fills unset limits; PerSource defaults to a quarter of the node's concurrency,
// ListingsPerNamespace to a quarter of its listings.
func (l Limits) WithDefaults(concurrency int) Limits {
	d := DefaultLimits
	set := func(v *int64, def int64) {
		if *v <= 0 {
			*v = def
		}
	}
	set(&l.MaxBytes, d.MaxBytes)
	set(&l.MaxObjects, d.MaxObjects)
	set(&l.MaxManifestBytes, d.MaxManifestBytes)
	set(&l.MinThroughput, d.MinThroughput)
	if l.MaxKeyLength <= 0 {
		l.MaxKeyLength = d.MaxKeyLength
	}
	if l.MaxKeyDepth <= 0 {
		l.MaxKeyDepth = d.MaxKeyDepth
	}
	if l.ReadGrace <= 0 {
		l.ReadGrace = d.ReadGrace
	}
	if l.JobDeadline <= 0 {
		l.JobDeadline = d.JobDeadline
	}
	if l.AbandonAfter <= 0 {
		l.AbandonAfter = d.AbandonAfter
	}
	if l.PerSource <= 0 {
		l.PerSource = max(1, concurrency/4)
	}
	if l.Listings <= 0 {
		l.Listings = d.Listings
	}
	if l.ListingsPerSource <= 0 {
		l.ListingsPerSource = d.ListingsPerSource
	}
	if l.ListingsPerNamespace <= 0 {
		l.ListingsPerNamespace = max(1, l.Listings/4)
	}
	if l.ListingMinRate <= 0 {
		l.ListingMinRate = d.ListingMinRate
	}
	if l.ListingRateWindow <= 0 {
		l.ListingRateWindow = d.ListingRateWindow
	}
	set(&l.MaxGlobWork, d.MaxGlobWork)
	if l.MaxVersions <= 0 {
		l.MaxVersions = d.MaxVersions
	}
	return l
}

// CheckKey refuses a key past the length and depth limits.
func (l Limits) CheckKey(key string) error {
	if len(key) > l.MaxKeyLength {
		return source.Errorf(source.Invalid, "entry %.64q... is %d bytes long, more than the %d allowed", key, len(key), l.MaxKeyLength)
	}
	if d := strings.Count(key, "/") + 1; d > l.MaxKeyDepth {
		return source.Errorf(source.Invalid, "entry %.64q... is %d levels deep, more than the %d allowed", key, d, l.MaxKeyDepth)
	}
	return nil
}

// CheckTotals refuses a dataset past the size and entry limits, as soon as the listing shows it.
func (l Limits) CheckTotals(objects, bytes int64) error {
	if objects > l.MaxObjects {
		return source.Errorf(source.TooLarge, "it has more than %d entries, the most a dataset may have on this node", l.MaxObjects)
	}
	if bytes > l.MaxBytes {
		return source.Errorf(source.TooLarge, "it holds more than %s, the most a dataset may hold on this node", units.HumanBytes(l.MaxBytes))
	}
	return nil
}

// CheckListed refuses a listing that went through more entries than a dataset may have, those
// its filters drop included: dropping an entry costs the node as much as keeping it.
func (l Limits) CheckListed(listed int64) error {
	if listed > l.MaxObjects {
		return source.Errorf(source.TooLarge, "it has more than %d entries, counting those its include and exclude patterns drop, the most a dataset may have on this node", l.MaxObjects)
	}
	return nil
}

// Filter is spec's filter for one listing, with its glob work budget.
func (l Limits) Filter(spec *Spec) source.Filter {
	f := spec.Filter()
	f.Work = source.NewWork(l.MaxGlobWork)
	return f
}

// ReadTimeout is how long a read of n bytes may take.
func (l Limits) ReadTimeout(n int64) time.Duration {
	return l.ReadGrace + time.Duration(float64(n)/float64(l.MinThroughput)*float64(time.Second))
}
