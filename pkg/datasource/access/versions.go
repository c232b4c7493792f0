package access

// Several ready versions of one dataset (cache/versions.go): a caller is served only one it
// proves, by the rules of Prove, unchanged. Which one is decided by what the caller already
// proved (a remembered proof), or else by its own listing, taken once for all the versions.

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"github.com/cistern-csi/cistern/pkg/datasource/dataset"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// pick is a listing of the source with a caller's credentials that says which of several
// versions the caller sees, shared by the callers that wait for it.
type pick struct {
	done   chan struct{}
	digest string
	err    error
}

// ProveAny shows which of the ready versions of a dataset the caller reads, and returns it. A
// refusal remembered for any of them is the answer; else the version of a remembered proof, or
// the one version the caller's own listing equals, is proved by Prove (one pinned read, or its
// listing and every file). ErrListingDiffers (wrapped) says the caller sees none of them.
func (p *Prover) ProveAny(ctx context.Context, who string, open Opener, spec *dataset.Spec, versions []cache.Version) (cache.Version, error) {
	if len(versions) == 1 {
		v := versions[0]
		return v, p.Prove(ctx, who, open, spec, v.Dir, v.Meta, v.Digest)
	}
	now := time.Now()
	known := -1
	p.mu.Lock()
	for i, v := range versions {
		key := v.Digest + "\x00" + who
		if d, ok := p.denials[key]; ok && now.Before(d.until) {
			p.mu.Unlock()
			return cache.Version{}, d.err // retries cost nothing, as Prove's do
		}
		if until, ok := p.proofs[key]; ok && now.Before(until) && known < 0 {
			known = i
		}
	}
	p.mu.Unlock()
	if known >= 0 {
		v := versions[known]
		err := p.Prove(ctx, who, open, spec, v.Dir, v.Meta, v.Digest)
		if !errors.Is(err, ErrListingDiffers) {
			return v, err
		}
		// Its data changed since: its listing says which version it sees now.
	}
	digest, err := p.listingOf(ctx, who, open, spec, versions)
	if err != nil {
		return cache.Version{}, err
	}
	i := slices.IndexFunc(versions, func(v cache.Version) bool { return v.Digest == digest })
	if i < 0 {
		return cache.Version{}, ErrListingDiffers
	}
	v := versions[i]
	return v, p.Prove(ctx, who, open, spec, v.Dir, v.Meta, v.Digest)
}

// listingOf is the digest of the caller's listing, taken once for callers that wait for it and
// apart from their ctx, which only bounds the wait (a retry finds it). A refused listing is
// remembered as a refused proof of every version.
func (p *Prover) listingOf(ctx context.Context, who string, open Opener, spec *dataset.Spec, versions []cache.Version) (string, error) {
	digests := make([]string, len(versions))
	for i, v := range versions {
		digests[i] = v.Digest
	}
	key := strings.Join(digests, ",") + "\x00" + who
	p.mu.Lock()
	if p.picks == nil {
		p.picks = map[string]*pick{}
	}
	pk := p.picks[key]
	if pk == nil {
		pk = &pick{done: make(chan struct{})}
		p.picks[key] = pk
		go p.runPick(open, spec, versions, who, key, pk)
	}
	p.mu.Unlock()
	select {
	case <-pk.done:
		return pk.digest, pk.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func (p *Prover) runPick(open Opener, spec *dataset.Spec, versions []cache.Version, who, key string, pk *pick) {
	ctx, cancel := context.WithTimeout(context.Background(), proofTimeout)
	defer cancel()
	select {
	case p.slots <- struct{}{}:
		pk.digest, pk.err = p.list(ctx, open, spec)
		<-p.slots
	case <-ctx.Done():
		pk.err = source.Wrap(source.Retryable, ctx.Err(), "waiting to check access")
	}
	p.mu.Lock()
	delete(p.picks, key)
	if source.KindOf(pk.err) == source.Denied {
		for _, v := range versions {
			p.rememberDenialLocked(v.Digest+"\x00"+who, pk.err)
		}
	}
	p.mu.Unlock()
	close(pk.done)
}

// list lists the source as staging does, with the caller's credentials, within the node's
// listing slots, and returns the digest of what it keeps.
func (p *Prover) list(ctx context.Context, open Opener, spec *dataset.Spec) (string, error) {
	src, err := open()
	if err != nil {
		return "", err
	}
	defer src.Close()
	return cache.ListingDigest(ctx, p.cfg.Listings.Source(spec, src), spec, p.cfg.Limits)
}
