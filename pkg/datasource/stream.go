package datasource

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// StreamDir is where a streaming volume keeps the bytes it fetched on demand, inside the dataset
// directory: <dataset>/stream/<volume's reference name>.
const StreamDir = "stream"

// Streaming is what a streaming volume serves before its dataset is staged: the manifest the
// caller proved it reads, the cached files as the staging engine commits them, and the caller's
// own source for the rest. Release gives the dataset back to eviction.
type Streaming struct {
	Objects []source.Object
	// Source reads with the caller's credentials, pinned to the manifest.
	Source source.Source
	// Scratch is the volume's directory for bytes fetched on demand.
	Scratch string
	// OnFetch counts a fetch on demand and its outcome (metrics).
	OnFetch func(key string, off, n int64, err error)
	// Room makes room for n bytes on the pool, as staging does: never below the low watermark.
	Room    func(ctx context.Context, n int64) error
	dir     string
	release func()
	// job is the staging that fills the cache for the volume: the one whose manifest the caller
	// proved it reads.
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

// Cached opens obj's verified file if the cache holds all of it (staging/ while the staging
// runs, tree/ once it is done), or returns nil. Reads stay inside the dataset (os.Root).
func (s *Streaming) Cached(obj source.Object) (*os.File, error) {
	for _, sub := range []string{cache.TreeDir, cache.StagingDir, cache.TreeDir} { // tree/ again: staging/ may have just been renamed
		f, err := os.OpenInRoot(filepath.Join(s.dir, sub), obj.Key)
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

// Release drops the volume's pin on the dataset and closes the caller's source.
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

// streaming pins job j's dataset for a streaming volume and reads its manifest.
func (m *Manager) streaming(req Request, j *staging, volumeID string) (*Streaming, error) {
	dir := j.Dir()
	var objs []source.Object
	if err := cache.EachObject(dir, func(_ int64, o source.Object) error { objs = append(objs, o); return nil }); err != nil {
		return nil, fmt.Errorf("%s: reading the manifest: %w", req.Spec.Describe(), err)
	}
	src, err := m.openSource(req)
	if err != nil {
		return nil, err
	}
	scratch := filepath.Join(dir, StreamDir, cache.RefName(volumeID))
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		src.Close()
		return nil, cache.WriteErr(err)
	}
	unpin := m.cache.PinReader(req.Pool, filepath.Base(dir))
	var once sync.Once
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
	return &Streaming{Objects: objs, Source: src, Scratch: scratch, OnFetch: onFetch, Room: room, dir: dir, job: j, onJoin: onJoin, release: func() {
		once.Do(func() {
			src.Close()
			_ = os.RemoveAll(scratch)
			unpin()
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
