package datasource

// Access to cached data among tenants. Every caller proves its own read access, with its own
// credentials, before it is handed anything of a dataset, whichever way it reaches it: a cache
// hit, joining a staging under way, resuming a partial staging, a writable copy, pieces from
// peers. A proof is:
//
//   - the caller's listing of the source, filtered as staging filters it, equals the cached
//     manifest entry for entry (keys, ETags or versions, sizes, link targets). Listing the same
//     bucket name is not enough: servers that resolve a bucket per credential would otherwise let
//     one tenant plant files that another is served;
//   - every file of the manifest may be read by the caller, pinned to its listed ETag: one HEAD
//     per file on S3 (source.ReadChecker), in parallel. List rights are not read rights, and read
//     rights differ per object under prefix policies and object ACLs, so a sample proves nothing
//     of the other files. Sources without per-tenant credentials (NFS as the node's uid, node-local
//     paths) read one file.
//
// A proof is remembered per (dataset version, caller) for Config.AccessProofTTL; within it a hit
// costs one pinned read, which notices credentials revoked since. A proof refused (Denied) is
// remembered as long, so a caller retrying learns nothing new and costs the node nothing. Callers
// are told apart by a keyed hash of their credentials; the key is random per process, so nothing
// that identifies a tenant is stored.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// errListingDiffers is a proof that failed because the caller sees other data than the cache
// holds: the source changed since it was staged, or the caller's credentials resolve to other
// data. Either way the caller gets a staging of what it sees, never the cached data.
var errListingDiffers = errors.New("the source's listing differs from the cached dataset")

// proofTimeout bounds one proof (a full listing), whoever waits for it.
const proofTimeout = 10 * time.Minute

// maxProofs bounds the remembered proofs; expired ones are dropped first.
const maxProofs = 4096

// concurrentProofs bounds the full proofs (listings) under way on the node: a pod author can name
// many credentials, and each proof holds a listing's digests in memory.
const concurrentProofs = 4

// principal names the caller of a request: a keyed hash of its credentials, or the fixed
// identity of a source without per-tenant credentials (NFS's AUTH_UNIX as the node's configured
// uid, node-local paths).
func (m *Manager) principal(req Request) string {
	switch req.Spec.Scheme {
	case SchemeNFS:
		return fmt.Sprintf("nfs:%d:%d", m.nfsUID, m.nfsGID)
	case SchemeLocal:
		return "local"
	}
	// A tenant's source may connect only where --tenant-s3-endpoints allows, an administrator's
	// anywhere: the same credentials (or none) under two policies are two principals, so a
	// tenant never joins, nor is served on the strength of, a proof its own policy could not
	// have made.
	scope := "s3:"
	if req.Spec.Tenant {
		scope = "s3-tenant:"
	}
	c := req.Creds
	if c.AccessKeyID == "" {
		return scope + "anonymous"
	}
	mac := hmac.New(sha256.New, m.principalKey)
	for _, s := range []string{c.AccessKeyID, c.SecretAccessKey, c.SessionToken} {
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

// digester folds manifest entries into one value that does not depend on their order: the
// sorted per-entry hashes, hashed. It holds 16 bytes per entry.
type digester struct{ sums [][16]byte }

func (d *digester) add(o source.Object) error {
	b, err := json.Marshal(o)
	if err != nil {
		return err
	}
	s := sha256.Sum256(b)
	d.sums = append(d.sums, [16]byte(s[:16]))
	return nil
}

func (d *digester) sum() string {
	slices.SortFunc(d.sums, func(a, b [16]byte) int { return bytes.Compare(a[:], b[:]) })
	h := sha256.New()
	for _, s := range d.sums {
		h.Write(s[:])
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// keepEntry is staging's filter over listed entries: it says whether o belongs to the dataset
// and refuses entries that could not be staged safely.
func keepEntry(limits Limits, filter source.Filter, o source.Object) (bool, error) {
	var keep bool
	if o.Type == source.Dir {
		keep = filter.MatchDir(o.Key) && (len(filter.Include) == 0 || filter.Match(o.Key))
	} else {
		keep = filter.Match(o.Key)
	}
	if filter.Work.Spent() {
		return false, source.Errorf(source.TooLarge, "matching its include and exclude patterns against its keys took more than %d units of work (pattern bytes times key bytes), the most a listing may take on this node", limits.MaxGlobWork)
	}
	if !keep {
		return false, nil
	}
	if err := source.ValidateKey(o.Key); err != nil {
		return false, err
	}
	if err := limits.checkKey(o.Key); err != nil {
		return false, err
	}
	if o.Type == source.Symlink {
		if err := source.ValidateSymlink(o.Key, o.Target); err != nil {
			return false, err
		}
	}
	if o.Size < 0 {
		return false, source.Errorf(source.Invalid, "entry %q has a negative size", o.Key)
	}
	return true, nil
}

// listingDigest lists src as staging would and returns the digest of what it keeps.
func listingDigest(ctx context.Context, src source.Source, spec *Spec, limits Limits) (string, error) {
	filter := limits.filter(spec)
	var d digester
	var bytes, listed int64
	err := src.List(ctx, func(o source.Object) error {
		if listed++; listed > limits.MaxObjects {
			return limits.checkListed(listed)
		}
		keep, err := keepEntry(limits, filter, o)
		if err != nil || !keep {
			return err
		}
		bytes += o.Size
		if err := limits.checkTotals(int64(len(d.sums)+1), bytes); err != nil {
			return err
		}
		return d.add(o)
	})
	if err != nil {
		return "", err
	}
	return d.sum(), nil
}

// manifestDigest is the digest of a committed manifest: from meta.json, or computed for a cache
// written before digests were recorded.
func manifestDigest(dir string, md *meta) (string, error) {
	if md.Digest != "" {
		return md.Digest, nil
	}
	var d digester
	if err := eachObject(dir, func(_ int64, o source.Object) error { return d.add(o) }); err != nil {
		return "", err
	}
	return d.sum(), nil
}

// minDenialTTL is the least time a refused proof is remembered, also with AccessProofTTL 0.
const minDenialTTL = time.Minute

// readsEvery proves that src's credentials may read every file entry of the manifest in dir as
// listed: one check per file (source.ReadChecker), at most the node's read concurrency at once,
// stopping at the first refusal. A source without per-entry checks reads one file (pinnedRead).
func (m *Manager) readsEvery(ctx context.Context, src source.Source, dir string, md *meta) error {
	rc, ok := src.(source.ReadChecker)
	if !ok {
		return m.pinnedRead(ctx, src, dir, md)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	slots := make(chan struct{}, m.cfg.Concurrency)
	var wg sync.WaitGroup
	err := eachObject(dir, func(_ int64, o source.Object) error {
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

// sampleFile returns a file of the manifest with at least one byte, chosen at random, and false
// when the dataset has none. It decodes only the lines it needs.
func sampleFile(dir string, objects int64) (source.Object, bool, error) {
	f, err := os.Open(filepath.Join(dir, objectsFile))
	if err != nil {
		return source.Object{}, false, err
	}
	defer f.Close()
	start := int64(0)
	if objects > 1 {
		start = mrand.Int64N(objects)
	}
	var first source.Object
	found := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for i := int64(0); sc.Scan(); i++ {
		if found && i < start {
			continue // the first match before start is kept as the wrap-around answer
		}
		var o source.Object
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			return source.Object{}, false, fmt.Errorf("corrupt manifest line %d: %w", i+1, err)
		}
		if o.Type != source.File || o.Size == 0 {
			continue
		}
		if i >= start {
			return o, true, nil
		}
		first, found = o, true
	}
	return first, found, sc.Err()
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

// prove shows that req's caller reads the data of the dataset version in dir (whose manifest has
// the given digest): from a remembered proof plus one pinned read, or a full listing plus one
// pinned read. A proof outlives the caller's ctx (a retry finds it finished); ctx only bounds the
// wait. errListingDiffers (wrapped) says the caller sees other data.
func (m *Manager) prove(ctx context.Context, req Request, dir string, md *meta, digest string) error {
	who := m.principal(req)
	key := digest + "\x00" + who
	m.mu.Lock()
	if d, ok := m.denials[key]; ok && time.Now().Before(d.until) {
		m.mu.Unlock()
		return d.err
	}
	until, known := m.proofs[key]
	p := m.proving[key]
	if !known || time.Now().After(until) {
		known = false
		if p == nil {
			p = &proof{done: make(chan struct{})}
			m.proving[key] = p
			go m.runProof(req, dir, md, digest, key, p)
		}
	}
	m.mu.Unlock()
	if known {
		src, err := m.openSource(req)
		if err != nil {
			return err
		}
		defer src.Close()
		err = m.pinnedRead(ctx, src, dir, md)
		switch source.KindOf(err) {
		case source.Changed:
			m.forgetProof(key)
			return fmt.Errorf("%w: %w", errListingDiffers, err)
		case source.Denied:
			// Revoked since: the next attempt proves afresh after the denial expires.
			m.forgetProof(key)
			m.mu.Lock()
			m.rememberDenialLocked(key, err)
			m.mu.Unlock()
		}
		return err
	}
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *Manager) runProof(req Request, dir string, md *meta, digest, key string, p *proof) {
	ctx, cancel := context.WithTimeout(context.Background(), proofTimeout)
	defer cancel()
	select {
	case m.proofSlots <- struct{}{}:
		p.err = m.fullProof(ctx, req, dir, md, digest)
		<-m.proofSlots
	case <-ctx.Done():
		p.err = source.Wrap(source.Retryable, ctx.Err(), "waiting to check access")
	}
	m.mu.Lock()
	delete(m.proving, key)
	switch {
	case p.err == nil:
		m.rememberLocked(key)
	case source.KindOf(p.err) == source.Denied:
		m.rememberDenialLocked(key, p.err)
	}
	m.mu.Unlock()
	close(p.done)
}

func (m *Manager) fullProof(ctx context.Context, req Request, dir string, md *meta, digest string) error {
	src, err := m.openSource(req)
	if err != nil {
		return err
	}
	defer src.Close()
	release, err := m.listingSlot(ctx, req.Spec)
	if err != nil {
		return err
	}
	got, err := listingDigest(ctx, src, req.Spec, m.limits)
	release()
	if err != nil {
		return err
	}
	if got != digest {
		return errListingDiffers
	}
	err = m.readsEvery(ctx, src, dir, md)
	if source.KindOf(err) == source.Changed {
		return fmt.Errorf("%w: %w", errListingDiffers, err)
	}
	return err
}

func (m *Manager) pinnedRead(ctx context.Context, src source.Source, dir string, md *meta) error {
	obj, ok, err := sampleFile(dir, md.Objects)
	if err != nil || !ok {
		return err // no file with bytes: the listing alone shows the data
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return readOne(ctx, src, obj)
}

// remember records that a caller read the dataset version (its digest) in full: the staging's
// own principal when it ends.
func (m *Manager) remember(digest, who string) {
	m.mu.Lock()
	m.rememberLocked(digest + "\x00" + who)
	m.mu.Unlock()
}

func (m *Manager) rememberLocked(key string) {
	if m.cfg.AccessProofTTL <= 0 {
		return
	}
	now := time.Now()
	if len(m.proofs) >= maxProofs {
		for k, until := range m.proofs {
			if now.After(until) {
				delete(m.proofs, k)
			}
		}
		for k := range m.proofs {
			if len(m.proofs) < maxProofs {
				break
			}
			delete(m.proofs, k)
		}
	}
	m.proofs[key] = now.Add(m.cfg.AccessProofTTL)
}

// denial is a refused proof, remembered: the caller's retries get the same answer without
// another listing or check.
type denial struct {
	until time.Time
	err   error
}

func (m *Manager) rememberDenialLocked(key string, err error) {
	now := time.Now()
	if len(m.denials) >= maxProofs {
		for k, d := range m.denials {
			if now.After(d.until) || len(m.denials) >= maxProofs {
				delete(m.denials, k)
			}
		}
	}
	m.denials[key] = denial{until: now.Add(max(m.cfg.AccessProofTTL, minDenialTTL)), err: err}
}

// rememberDenial records that who was refused the dataset version (its digest).
func (m *Manager) rememberDenial(digest, who string, err error) {
	m.mu.Lock()
	m.rememberDenialLocked(digest+"\x00"+who, err)
	m.mu.Unlock()
}

func (m *Manager) forgetProof(key string) {
	m.mu.Lock()
	delete(m.proofs, key)
	m.mu.Unlock()
}
