package datasource

// Access to cached data among tenants. Every caller proves its own read access, with its own
// credentials, before it is handed anything of a dataset, whichever way it reaches it: a cache
// hit, joining a staging under way, resuming a partial staging, a writable copy. A proof is:
//
//   - the caller's listing of the source, filtered as staging filters it, equals the cached
//     manifest entry for entry (keys, ETags or versions, sizes, link targets). Listing the same
//     bucket name is not enough: servers that resolve a bucket per credential would otherwise let
//     one tenant plant files that another is served;
//   - one file of the manifest, chosen at random, is read (one byte) pinned to its listed ETag or
//     version: list rights are not read rights.
//
// A listing costs about what staging's own listing costs, so a proof is remembered per (dataset
// version, caller) for Config.AccessProofTTL; within it a hit costs the one pinned read, which
// also notices credentials revoked since. Callers are told apart by a keyed hash of their
// credentials; the key is random per process, so nothing that identifies a tenant is stored.

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
	c := req.Creds
	if c.AccessKeyID == "" {
		return "anonymous"
	}
	mac := hmac.New(sha256.New, m.principalKey)
	for _, s := range []string{c.AccessKeyID, c.SecretAccessKey, c.SessionToken} {
		fmt.Fprintf(mac, "%d:%s", len(s), s)
	}
	return "s3:" + hex.EncodeToString(mac.Sum(nil)[:16])
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
	if o.Type == source.Dir {
		if !filter.MatchDir(o.Key) || len(filter.Include) > 0 && !filter.Match(o.Key) {
			return false, nil
		}
	} else if !filter.Match(o.Key) {
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
	filter := spec.Filter()
	var d digester
	var bytes int64
	err := src.List(ctx, func(o source.Object) error {
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
// pinned read. Either check runs apart from the caller's ctx, which only bounds the wait; a check
// that ended with nobody waiting answers the next attempt (within checkReuse), so a caller whose
// deadline is shorter than one read of the source still gets through, and each answer comes from
// a check made after the caller's previous answer. errListingDiffers (wrapped) says the
// caller sees other data.
func (m *Manager) prove(ctx context.Context, req Request, dir string, md *meta, digest string) error {
	who := m.principal(req)
	key := digest + "\x00" + who
	m.mu.Lock()
	until, known := m.proofs[key]
	known = known && !time.Now().After(until)
	pkey := key + "\x00full"
	if known {
		pkey = key + "\x00pinned"
	}
	p := m.proving[pkey]
	if p == nil {
		p = &proof{done: make(chan struct{})}
		m.proving[pkey] = p
		go m.runProof(req, dir, md, digest, key, pkey, known, p)
	}
	m.mu.Unlock()
	select {
	case <-p.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	m.mu.Lock()
	if m.proving[pkey] == p { // told once: the next attempt checks again
		delete(m.proving, pkey)
	}
	m.mu.Unlock()
	if known && source.KindOf(p.err) == source.Changed {
		m.forgetProof(key)
		return fmt.Errorf("%w: %w", errListingDiffers, p.err)
	}
	return p.err
}

// checkReuse is how long a check that ended with nobody waiting is kept for the next attempt.
// Measured: with S3 answering each GET after 20 s and NodeStageVolume called with 4 s deadlines,
// checks bound to each call's ctx, or forgotten when they ended, never let a call through (80
// calls in 2 min 41 s, TestDatasetSlowStoreShortDeadlines).
const checkReuse = time.Minute

// runProof makes one check for key: the pinned read confirming a remembered proof (pinned), or a
// full proof, remembered when it succeeds. Its result stays under pkey until told, or checkReuse.
func (m *Manager) runProof(req Request, dir string, md *meta, digest, key, pkey string, pinned bool, p *proof) {
	ctx, cancel := context.WithTimeout(context.Background(), proofTimeout)
	defer cancel()
	if pinned {
		src, err := m.openSource(req)
		if err == nil {
			err = m.pinnedRead(ctx, src, dir, md)
			src.Close()
		}
		p.err = err
	} else {
		select {
		case m.proofSlots <- struct{}{}:
			p.err = m.fullProof(ctx, req, dir, md, digest)
			<-m.proofSlots
		case <-ctx.Done():
			p.err = source.Wrap(source.Retryable, ctx.Err(), "waiting to check access")
		}
	}
	m.mu.Lock()
	if !pinned && p.err == nil {
		m.rememberLocked(key)
	}
	m.mu.Unlock()
	close(p.done)
	time.AfterFunc(checkReuse, func() {
		m.mu.Lock()
		if m.proving[pkey] == p {
			delete(m.proving, pkey)
		}
		m.mu.Unlock()
	})
}

func (m *Manager) fullProof(ctx context.Context, req Request, dir string, md *meta, digest string) error {
	src, err := m.openSource(req)
	if err != nil {
		return err
	}
	defer src.Close()
	got, err := listingDigest(ctx, src, req.Spec, m.limits)
	if err != nil {
		return err
	}
	if got != digest {
		return errListingDiffers
	}
	err = m.pinnedRead(ctx, src, dir, md)
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

func (m *Manager) forgetProof(key string) {
	m.mu.Lock()
	delete(m.proofs, key)
	m.mu.Unlock()
}
