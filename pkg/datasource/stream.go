package datasource

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sync"

	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// StreamDir is where a streaming volume keeps the bytes it fetched on demand, inside its
// version's directory: <dataset>/stream/<volume's reference name>.
const StreamDir = cache.StreamDir

// Streaming is what a streaming volume serves before its dataset is staged: the manifest the
// caller proved it reads, the cached files as the staging engine commits them, and the caller's
// own source for the rest. The version's directory is held by descriptor and referenced for the
// volume (cache.Held): whatever is staged, moved aside or retired meanwhile, the volume reads
// that directory and no other. Release lets it go.
type Streaming struct {
	Objects []source.Object
	// Source reads with the caller's credentials, pinned to the manifest.
	Source source.Source
	// Scratch is the volume's directory for bytes fetched on demand, in the held directory (a
	// path through the descriptor: valid until Release; the mount holds it itself).
	Scratch string
	// OnFetch counts a fetch on demand and its outcome (metrics).
	OnFetch func(key string, off, n int64, err error)
	// Room makes room for n bytes on the pool, as staging does: never below the low watermark.
	Room func(ctx context.Context, n int64) error
	// Unverifiable applies the node's policy to an object nothing can check (err says why): nil
	// serves it, an error refuses it.
	Unverifiable func(ctx context.Context, obj source.Object, err error) error
	held         *cache.Held
	release      func()
	// job is the staging that fills the held directory, the one whose manifest the caller proved
	// it reads; nil when none does (it ended, or the volume was taken over from another process
	// and no staging fills that directory).
	job *staging
	// onJoin counts a join and its outcome (metrics).
	onJoin func(joined bool)
}

// Join waits until the volume's staging committed obj, manifest line i, to the cache (verified),
// having asked it to fetch obj before the rest of its queue, so that a read of a file not
// staged yet does not download it a second time beside the staging. True: Cached now opens it.
// False when the staging ended without it (failed, or never fetching it) or ctx ended: the read
// fetches it itself. Tenant-safe as Cached is: the staging is the one whose manifest this
// volume's caller proved it reads (Stream), and obj is of that manifest.
func (s *Streaming) Join(ctx context.Context, i int64, obj source.Object) bool {
	if s.job == nil {
		return false
	}
	committed := s.job.Prefer(i, obj)
	if committed == nil {
		return false
	}
	joined := false
	select {
	case <-committed:
		joined = true
	case <-s.job.done:
		// Ready: every file is in tree/. Failed: what it committed is gone or going.
		joined = s.job.err == nil
	case <-ctx.Done():
	}
	if s.onJoin != nil {
		s.onJoin(joined)
	}
	return joined
}

// Cached opens obj's verified file if the held directory holds all of it (staging/ while the
// staging runs, tree/ once it is done), or returns nil. Opened beneath the held directory, no
// link followed.
func (s *Streaming) Cached(obj source.Object) (*os.File, error) {
	for _, sub := range []string{cache.TreeDir, cache.StagingDir, cache.TreeDir} { // tree/ again: staging/ may have just been renamed
		f, err := s.held.Open(path.Join(sub, obj.Key))
		if err == nil {
			if st, serr := f.Stat(); serr == nil && st.Mode().IsRegular() && st.Size() == obj.Size {
				return f, nil
			}
			f.Close()
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	return nil, nil
}

// Release drops the volume's reference on its version, deletes what it fetched and closes the
// caller's source.
func (s *Streaming) Release() { s.release() }

// Stream is Ensure, then waits until the dataset's manifest is taken and the caller proved it
// reads it (a caller joining another's staging proves as a cache hit does), and returns what a
// streaming volume needs, pinned so that eviction leaves the dataset alone until Release. A
// dataset already staged returns its ready Status and no Streaming: the volume is the tree. When
// ctx ends first it returns the progress, no Streaming and no error.
func (m *Manager) Stream(ctx context.Context, req Request, volumeID string) (Status, *Streaming, error) {
	for {
		st, j, err := m.ensure(ctx, req)
		if err != nil || j == nil {
			return st, nil, err
		}
		select {
		case <-j.Listed():
			st := j.Status()
			if err := checkCapacity(req, st.BytesTotal, j.Alloc(), true); err != nil {
				return st, nil, fmt.Errorf("%s: %w", req.Spec.Describe(), err)
			}
			s, err := m.streaming(req, j, volumeID)
			return st, s, err
		case <-j.done:
			if m.othersFailure(req, j) {
				continue
			}
			st, err := m.finished(req, j)
			return st, nil, err
		case <-ctx.Done():
			return j.Status(), nil, nil
		}
	}
}

// streaming holds job j's directory for a streaming volume, the version the caller proved.
func (m *Manager) streaming(req Request, j *staging, volumeID string) (*Streaming, error) {
	_, digest := j.Manifest()
	h, err := m.cache.Hold(req.Pool, j.Dir(), digest, volumeID)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", req.Spec.Describe(), err)
	}
	return m.heldStream(req, h, j, volumeID)
}

// ResumeStream is Stream for a volume an earlier process of the plugin served (a takeover): it
// serves the very version the volume references, wherever that is now, once the caller proves
// again, with its own listing, that it reads that version (an earlier process's proof is not
// trusted). The caller's staging starts again (or is joined) and is joined by the volume's reads
// only if it fills that same directory. A volume that references no version (an older plugin
// served it) streams anew, as at its staging.
func (m *Manager) ResumeStream(ctx context.Context, req Request, volumeID string) (Status, *Streaming, error) {
	h, err := m.cache.HoldReferenced(req.Pool, req.Spec.ID(), volumeID)
	if source.KindOf(err) == source.NotFound {
		st, s, err := m.Stream(ctx, req, volumeID)
		if err != nil || s != nil || !st.Ready() {
			return st, s, err
		}
		if h, err = m.cache.HoldVersion(req.Pool, req.Spec, st.Version, volumeID); err != nil {
			return st, nil, err
		}
	} else if err != nil {
		return Status{}, nil, fmt.Errorf("%s: %w", req.Spec.Describe(), err)
	} else if err := m.proveHeld(ctx, req, h); err != nil {
		h.Close() // the volume keeps its reference until it is unstaged
		return Status{}, nil, err
	}
	st := Status{Dataset: req.Spec.Source, Phase: PhaseReady, Version: h.Digest}
	var j *staging
	if !h.Ready() {
		st.Phase = PhaseFetching
		j = m.stagingOf(ctx, req, h)
	}
	s, err := m.heldStream(req, h, j, volumeID)
	if err != nil {
		h.Close()
	}
	return st, s, err
}

// proveHeld proves that req's caller reads the held version.
func (m *Manager) proveHeld(ctx context.Context, req Request, h *cache.Held) error {
	if err := m.admit(req.Spec); err != nil {
		return fmt.Errorf("%s: %w", req.Spec.Describe(), err)
	}
	if _, err := m.egressPolicy(req.Spec); err != nil {
		return err
	}
	md, err := h.Meta()
	if err == nil {
		err = checkCapacity(req, md.Bytes, md.Alloc, true)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", req.Spec.Describe(), err)
	}
	if err := m.prove(ctx, req, h.Path(), md, h.Digest); err != nil {
		return fmt.Errorf("%s: %w", req.Spec.Describe(), err)
	}
	return nil
}

// stagingOf starts (or joins) the caller's staging and returns it if it fills the held
// directory, with its manifest taken; nil otherwise.
func (m *Manager) stagingOf(ctx context.Context, req Request, h *cache.Held) *staging {
	_, j, err := m.ensure(ctx, req)
	if err != nil || j == nil {
		return nil
	}
	select {
	case <-j.Listed():
	case <-ctx.Done():
		return nil
	}
	if _, digest := j.Manifest(); digest != h.Digest || !h.Is(j.Dir()) {
		return nil
	}
	return j
}

// heldStream is the streaming volume of the held version h, filled by staging j (nil: none).
func (m *Manager) heldStream(req Request, h *cache.Held, j *staging, volumeID string) (*Streaming, error) {
	src, err := m.openSource(req)
	if err != nil {
		_ = m.cache.Unhold(req.Pool, h, volumeID)
		return nil, err
	}
	scratch := filepath.Join(h.Path(), StreamDir, cache.RefName(volumeID))
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		src.Close()
		_ = m.cache.Unhold(req.Pool, h, volumeID)
		return nil, cache.WriteErr(err)
	}
	served := func() {}
	if j != nil {
		served = j.Serve()
	}
	id := req.Spec.ID()
	onFetch := func(_ string, _, n int64, err error) {
		if err != nil {
			m.metrics.streamFetches.WithLabelValues("refused").Inc()
			return
		}
		m.metrics.streamFetches.WithLabelValues("ok").Inc()
		m.metrics.fetchedBytes.WithLabelValues(id, "stream").Add(float64(n))
	}
	room := func(ctx context.Context, n int64) error { return m.cache.Room(ctx, req.Pool, n) }
	onJoin := func(joined bool) {
		result := "joined"
		if !joined {
			result = "fetched"
		}
		m.metrics.streamJoins.WithLabelValues(result).Inc()
	}
	unverifiable := func(ctx context.Context, obj source.Object, err error) error {
		return m.unverifiable(ctx, id, obj, err)
	}
	var once sync.Once
	return &Streaming{Objects: h.Objects, Source: src, Scratch: scratch, OnFetch: onFetch, Room: room, Unverifiable: unverifiable, held: h, job: j, onJoin: onJoin, release: func() {
		once.Do(func() {
			src.Close()
			served()
			_ = os.RemoveAll(scratch)
			if err := m.cache.Unhold(req.Pool, h, volumeID); err != nil {
				klog.Background().Error(err, "releasing a streaming volume's dataset version", "volumeID", volumeID)
			}
		})
	}}, nil
}

// Stream asks for a streaming volume of the dataset on pool; see Manager.Stream.
func (d *Datasets) Stream(ctx context.Context, pool string, spec *Spec, creds Credentials, capacity int64, volumeID string) (Status, *Streaming, error) {
	p, err := d.path(pool)
	if err != nil {
		return Status{}, nil, err
	}
	return d.m.Stream(ctx, Request{Spec: spec, Creds: creds, Pool: p, Capacity: capacity}, volumeID)
}

// ResumeStream serves a streaming volume taken over from an earlier process; see
// Manager.ResumeStream.
func (d *Datasets) ResumeStream(ctx context.Context, pool string, spec *Spec, creds Credentials, capacity int64, volumeID string) (Status, *Streaming, error) {
	p, err := d.path(pool)
	if err != nil {
		return Status{}, nil, err
	}
	return d.m.ResumeStream(ctx, Request{Spec: spec, Creds: creds, Pool: p, Capacity: capacity}, volumeID)
}
