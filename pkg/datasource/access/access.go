// Package access decides who may be handed cached data among tenants. Every caller proves its own
// read access, with its own credentials, before it is handed anything of a dataset, whichever way
// it reaches it: a cache hit, joining a staging under way, resuming a partial staging, a writable
// copy, pieces from peers. A proof is:
//
//   - the caller's listing of the source, filtered as staging filters it, equals the cached
//     manifest entry for entry (keys, ETags or versions, sizes, link targets). Listing the same
//     bucket name is not enough: servers that resolve a bucket per credential would otherwise let
//     one tenant plant files that another is served;
//   - every file of the manifest may be read by the caller, pinned to its listed ETag: one HEAD
//     per file on S3, an ACCESS per file on NFS (source.ReadChecker), in parallel. List rights are
//     not read rights, and read rights differ per object under prefix policies and object ACLs,
//     and per file under NFS owners and modes, so a sample proves nothing of the other files.
//     Node-local paths, read by the plugin's one identity, read one file.
//
// A proof is remembered per (dataset version, caller) for Config.TTL (the driver's
// --dataset-access-ttl); within it a hit costs one pinned read, which notices credentials revoked
// since. A proof refused (Denied) is remembered as long, so a caller retrying learns nothing new
// and costs the node nothing. Callers are told apart by a keyed hash of their credentials; the
// key is random per process, so nothing that identifies a tenant is stored.
package access

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"github.com/cistern-csi/cistern/pkg/datasource/dataset"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// ErrListingDiffers is a proof that failed because the caller sees other data than the cache
// holds: the source changed since it was staged, or the caller's credentials resolve to other
// data. Either way the caller gets a staging of what it sees, never the cached data.
var ErrListingDiffers = errors.New("the source's listing differs from the cached dataset")

// proofTimeout bounds one proof (a full listing), whoever waits for it.
const proofTimeout = 10 * time.Minute

// maxProofs bounds the remembered proofs; expired ones are dropped first.
const maxProofs = 4096

// concurrentProofs bounds the full proofs (listings) under way on the node: a pod author can name
// many credentials, and each proof holds a listing's digests in memory.
const concurrentProofs = 4

// Config configures a Prover.
type Config struct {
	// TTL is how long a caller's full proof is remembered; within it a cache hit costs one
	// pinned read. 0 lists on every hit.
	TTL time.Duration
	// Limits are staging's, which a proof's listing honours as staging's own does.
	Limits dataset.Limits
	// Listings bound the listings under way on the node, stagings' and proofs' alike.
	Listings *dataset.ListingSlots
	// Concurrency bounds the checks of one proof under way at once (the node's read slots).
	Concurrency int
	// NFSUID and NFSGID are the AUTH_UNIX identity of the node's NFS client: every caller of an
	// NFS source is that one principal.
	NFSUID, NFSGID uint32
}

// Prover proves callers' access to dataset versions and remembers the proofs. One per node.
type Prover struct {
	cfg Config
	// key keys the hash that tells callers apart.
	key []byte

	mu      sync.Mutex
	proofs  map[string]time.Time // digest/principal -> proof valid until
	proving map[string]*proof    // digest/principal -> proof under way
	denials map[string]denial    // digest/principal -> refused proof, remembered
	picks   map[string]*pick     // versions/principal -> which version its listing is (versions.go)
	// slots bounds the full proofs under way.
	slots chan struct{}
}

// New returns a Prover with a fresh principal key.
func New(cfg Config) *Prover {
	return &Prover{cfg: cfg, key: newPrincipalKey(), proofs: map[string]time.Time{},
		proving: map[string]*proof{}, denials: map[string]denial{}, slots: make(chan struct{}, concurrentProofs)}
}

// Opener opens the source with the caller's own credentials.
type Opener func() (source.Source, error)

// Principal names the caller of a request: a keyed hash of its credentials, or the fixed
// identity of a source without per-tenant credentials (NFS's AUTH_UNIX as the node's configured
// uid, node-local paths).
func (p *Prover) Principal(spec *dataset.Spec, c dataset.Credentials) string {
	switch spec.Scheme {
	case dataset.SchemeNFS:
		return fmt.Sprintf("nfs:%d:%d", p.cfg.NFSUID, p.cfg.NFSGID)
	case dataset.SchemeLocal:
		return "local"
	}
	// A tenant's source may connect only where --tenant-s3-endpoints allows, an administrator's
	// anywhere: the same credentials (or none) under two policies are two principals, so a
	// tenant never joins, nor is served on the strength of, a proof its own policy could not
	// have made.
	scope := "s3:"
	if spec.Tenant {
		scope = "s3-tenant:"
	}
	if c.AccessKeyID == "" && c.RoleARN == "" {
		return scope + "anonymous"
	}
	// A web identity is its role and its token: two pods with different roles, or of different
	// ServiceAccounts, are two principals, and each proves its own access.
	mac := hmac.New(sha256.New, p.key)
	for _, s := range []string{c.AccessKeyID, c.SecretAccessKey, c.SessionToken, c.RoleARN, c.WebIdentityToken} {
		fmt.Fprintf(mac, "%d:%s", len(s), s)
	}
	return scope + hex.EncodeToString(mac.Sum(nil)[:16])
}

func newPrincipalKey() []byte {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return k
}

// readOne reads the first byte of obj pinned to its listed ETag or version.
func readOne(ctx context.Context, src source.Source, obj source.Object) error {
	r, err := src.Open(ctx, obj, 0, 1)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, r)
	if cerr := r.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return src.Verify(ctx, obj)
}

// proof is a check of one caller against one dataset version, shared by the callers that wait
// for it.
type proof struct {
	done chan struct{}
	err  error
}

// Prove shows that the caller who (with its source opened by open) reads the data of the dataset
// version in dir (whose manifest has the given digest): from a remembered proof plus one pinned
// read, or a full listing plus one pinned read. Either check runs apart from the caller's ctx,
// which only bounds the wait; a check that ended with nobody waiting answers the next attempt
// (within checkReuse), so a caller whose deadline is shorter than one read of the source still
// gets through, and each answer comes from a check made after the caller's previous answer.
// ErrListingDiffers (wrapped) says the caller sees other data.
func (p *Prover) Prove(ctx context.Context, who string, open Opener, spec *dataset.Spec, dir string, md *cache.Meta, digest string) error {
	key := digest + "\x00" + who
	p.mu.Lock()
	if d, ok := p.denials[key]; ok && time.Now().Before(d.until) {
		p.mu.Unlock()
		return d.err
	}
	until, known := p.proofs[key]
	known = known && !time.Now().After(until)
	pkey := key + "\x00full"
	if known {
		pkey = key + "\x00pinned"
	}
	pr := p.proving[pkey]
	if pr == nil {
		pr = &proof{done: make(chan struct{})}
		p.proving[pkey] = pr
		go p.runProof(open, spec, dir, md, digest, key, pkey, known, pr)
	}
	p.mu.Unlock()
	select {
	case <-pr.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	p.mu.Lock()
	if p.proving[pkey] == pr { // told once: the next attempt checks again
		delete(p.proving, pkey)
	}
	p.mu.Unlock()
	if known && source.KindOf(pr.err) == source.Changed {
		p.forget(key)
		return fmt.Errorf("%w: %w", ErrListingDiffers, pr.err)
	}
	return pr.err
}

// checkReuse is how long a check that ended with nobody waiting is kept for the next attempt.
// Measured: with S3 answering each GET after 20 s and NodeStageVolume called with 4 s deadlines,
// checks bound to each call's ctx, or forgotten when they ended, never let a call through (80
// calls in 2 min 41 s, TestDatasetSlowStoreShortDeadlines).
const checkReuse = time.Minute

// runProof makes one check for key: the pinned read confirming a remembered proof (pinned), or a
// full proof, remembered when it succeeds. Its result stays under pkey until told, or checkReuse.
func (p *Prover) runProof(open Opener, spec *dataset.Spec, dir string, md *cache.Meta, digest, key, pkey string, pinned bool, pr *proof) {
	ctx, cancel := context.WithTimeout(context.Background(), proofTimeout)
	defer cancel()
	if pinned {
		pr.err = p.pinnedProof(ctx, open, dir, md)
	} else {
		select {
		case p.slots <- struct{}{}:
			pr.err = p.fullProof(ctx, open, spec, dir, md, digest)
			<-p.slots
		case <-ctx.Done():
			pr.err = source.Wrap(source.Retryable, ctx.Err(), "waiting to check access")
		}
	}
	p.mu.Lock()
	switch {
	case pr.err == nil && !pinned:
		p.rememberLocked(key)
	case source.KindOf(pr.err) == source.Denied:
		// Revoked since, or never granted: the next attempt proves afresh after the denial expires.
		delete(p.proofs, key)
		p.rememberDenialLocked(key, pr.err)
	}
	p.mu.Unlock()
	close(pr.done)
	time.AfterFunc(checkReuse, func() {
		p.mu.Lock()
		if p.proving[pkey] == pr {
			delete(p.proving, pkey)
		}
		p.mu.Unlock()
	})
}

// pinnedProof confirms a remembered proof with one pinned read.
func (p *Prover) pinnedProof(ctx context.Context, open Opener, dir string, md *cache.Meta) error {
	src, err := open()
	if err != nil {
		return err
	}
	defer src.Close()
	return PinnedRead(ctx, src, dir, md)
}

func (p *Prover) fullProof(ctx context.Context, open Opener, spec *dataset.Spec, dir string, md *cache.Meta, digest string) error {
	src, err := open()
	if err != nil {
		return err
	}
	defer src.Close()
	got, err := cache.ListingDigest(ctx, p.cfg.Listings.Source(spec, src), spec, p.cfg.Limits)
	if err != nil {
		return err
	}
	if got != digest {
		return ErrListingDiffers
	}
	err = p.ReadsEvery(ctx, src, dir, md)
	if source.KindOf(err) == source.Changed {
		return fmt.Errorf("%w: %w", ErrListingDiffers, err)
	}
	return err
}

// PinnedRead reads one byte of a file of the manifest in dir, chosen at random, pinned to its
// listed ETag or version: list rights are not read rights.
func PinnedRead(ctx context.Context, src source.Source, dir string, md *cache.Meta) error {
	obj, ok, err := cache.SampleFile(dir, md.Objects)
	if err != nil || !ok {
		return err // no file with bytes: the listing alone shows the data
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return readOne(ctx, src, obj)
}

// Remember records that a caller read the dataset version (its digest) in full: the staging's
// own principal when it ends.
func (p *Prover) Remember(digest, who string) {
	p.mu.Lock()
	p.rememberLocked(digest + "\x00" + who)
	p.mu.Unlock()
}

func (p *Prover) rememberLocked(key string) {
	if p.cfg.TTL <= 0 {
		return
	}
	now := time.Now()
	if len(p.proofs) >= maxProofs {
		for k, until := range p.proofs {
			if now.After(until) {
				delete(p.proofs, k)
			}
		}
		for k := range p.proofs {
			if len(p.proofs) < maxProofs {
				break
			}
			delete(p.proofs, k)
		}
	}
	p.proofs[key] = now.Add(p.cfg.TTL)
}

// denial is a refused proof, remembered: the caller's retries get the same answer without
// another listing or check.
type denial struct {
	until time.Time
	err   error
}

func (p *Prover) rememberDenialLocked(key string, err error) {
	now := time.Now()
	if len(p.denials) >= maxProofs {
		for k, d := range p.denials {
			if now.After(d.until) || len(p.denials) >= maxProofs {
				delete(p.denials, k)
			}
		}
	}
	p.denials[key] = denial{until: now.Add(max(p.cfg.TTL, minDenialTTL)), err: err}
}

// RememberDenial records that who was refused the dataset version (its digest).
func (p *Prover) RememberDenial(digest, who string, err error) {
	p.mu.Lock()
	p.rememberDenialLocked(digest+"\x00"+who, err)
	p.mu.Unlock()
}

// minDenialTTL is the least time a refused proof is remembered, also with TTL 0.
const minDenialTTL = time.Minute

// ReadsEvery proves that src's credentials may read every file entry of the manifest in dir as
// listed: one check per file (source.ReadChecker), at most the node's read concurrency at once,
// stopping at the first refusal. A source without per-entry checks reads one file (PinnedRead).
func (p *Prover) ReadsEvery(ctx context.Context, src source.Source, dir string, md *cache.Meta) error {
	rc, ok := src.(source.ReadChecker)
	if !ok {
		return PinnedRead(ctx, src, dir, md)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	slots := make(chan struct{}, p.cfg.Concurrency)
	var wg sync.WaitGroup
	err := cache.EachObject(dir, func(_ int64, o source.Object) error {
		if o.Type != source.File {
			return nil
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		wg.Go(func() {
			defer func() { <-slots }()
			cctx, done := context.WithTimeout(ctx, time.Minute)
			defer done()
			if err := rc.CheckRead(cctx, o); err != nil {
				cancel(err)
			}
		})
		return nil
	})
	wg.Wait()
	if cause := context.Cause(ctx); cause != nil {
		return cause // the first refusal, rather than the walk it stopped
	}
	return err
}

func (p *Prover) forget(key string) {
	p.mu.Lock()
	delete(p.proofs, key)
	p.mu.Unlock()
}
