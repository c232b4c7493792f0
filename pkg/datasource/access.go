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
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource/cache"
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
func (m *Manager) prove(ctx context.Context, req Request, dir string, md *cache.Meta, digest string) error {
	who := m.principal(req)
	key := digest + "\x00" + who
	m.mu.Lock()
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
		if source.KindOf(err) == source.Changed {
			m.forgetProof(key)
			return fmt.Errorf("%w: %w", errListingDiffers, err)
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

func (m *Manager) runProof(req Request, dir string, md *cache.Meta, digest, key string, p *proof) {
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
	if p.err == nil {
		m.rememberLocked(key)
	}
	m.mu.Unlock()
	close(p.done)
}

func (m *Manager) fullProof(ctx context.Context, req Request, dir string, md *cache.Meta, digest string) error {
	src, err := m.openSource(req)
	if err != nil {
		return err
	}
	defer src.Close()
	got, err := cache.ListingDigest(ctx, src, req.Spec, m.limits)
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

func (m *Manager) pinnedRead(ctx context.Context, src source.Source, dir string, md *cache.Meta) error {
	obj, ok, err := cache.SampleFile(dir, md.Objects)
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
