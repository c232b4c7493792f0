package streamfs

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// fileNode is a file of the manifest.
type fileNode struct {
	obj  source.Object
	line int64
	m    *mount

	mu     sync.Mutex
	st     *stream // the parts fetched on demand; made at the first read that needs one
	cached *handle // the cache's copy, once a read found it there (under the mount's OpenFiles)
	// How opens are answered. The kernel refuses to mix passthrough and cached opens of one
	// inode, and to change an inode's backing file while it is open; it also keeps opens
	// across a takeover. So a file is passed through only while no open answered otherwise may
	// still be held (viaServer counts this process's, and inherited says an earlier process
	// answered one: it may be open still), with one registration (backing) kept while any
	// open answered with it is, and dropped by the bound once none is (backing.go).
	backing   *backing
	viaServer int
	inherited bool
}

// Open hands a whole file (in the cache, or every part fetched) to the kernel: with passthrough
// its reads never reach this process. A file a read would wait for the staging's copy of
// (Config.Join) is waited for here, then handed over. Any other file is read through Read.
// Contents never change, so the kernel may keep its page cache across opens.
func (f *rawFS) Open(interrupt <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	n := f.t.get(in.NodeId)
	switch {
	case f.refused():
		return fuse.EIO
	case n == nil:
		return errStale
	case n.file == nil:
		return fuse.EISDIR
	case in.Flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC|syscall.O_APPEND) != 0:
		return fuse.Status(syscall.EROFS)
	}
	fl := n.file
	// Nothing to flush in a read-only file: a close never waits for this process (nor, while
	// no server runs, for the next).
	out.OpenFlags = fuse.FOPEN_NOFLUSH
	if fl.obj.Size == 0 {
		out.OpenFlags |= fuse.FOPEN_KEEP_CACHE
		return fuse.OK
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	bid := fl.backing.open()
	if bid == 0 && f.mayPassThrough(fl) {
		if !f.joinFirst(fl, interrupt) {
			// The reader gave up waiting (killed, or a signal): nothing is held for it.
			return fuse.EINTR
		}
		// Another open may have passed the file through meanwhile.
		if bid = fl.backing.open(); bid == 0 && f.mayPassThrough(fl) {
			bid = f.passThrough(in.NodeId, fl)
		}
	}
	if bid != 0 {
		out.BackingID = bid
		out.OpenFlags |= fuse.FOPEN_PASSTHROUGH
		out.Fh = f.passedFh() // its Release ends the open's hold on the registration
		return fuse.OK
	}
	if fl.viaServer == 0 {
		// Written before the kernel hears of the open: a process taking over knows it may
		// still be held.
		if err := f.m.opens.record(in.NodeId, 0); err != nil {
			klog.Background().Error(err, "streaming volume: recording an open", "key", fl.obj.Key)
			return fuse.EIO
		}
	}
	fl.viaServer++
	out.Fh = f.epoch
	out.OpenFlags |= fuse.FOPEN_KEEP_CACHE
	return fuse.OK
}

// mayPassThrough reports whether an open of fl may be passed through (fl.mu held).
func (f *rawFS) mayPassThrough(fl *fileNode) bool {
	return fl.viaServer == 0 && !fl.inherited && !f.m.opens.noPassthrough.Load()
}

// passedFh marks the opens this process passed through, as epoch marks those it answers
// without passthrough: even, where epoch is odd.
func (f *rawFS) passedFh() uint64 { return f.epoch&^1 | 2 }

// joinFirst waits, in the open, for the staging's verified copy of a file a read would wait for
// anyway (Config.Join, joins), so that the open is passed through to it: then every read of the
// file is the kernel's. Answered without it, the open's reads all come to this process, which
// cannot change an open inode's backing later: a whole 2 GiB object read right after publish took
// 1.48× "staged, then read", 3 s of its 4.8 s after the staging's copy was there, served by the
// plugin (docs/benchmarks.md). Called with fl.mu held; releases it while waiting. False: the
// kernel interrupted the open (its process killed or signalled) before the copy was there.
func (f *rawFS) joinFirst(fl *fileNode, interrupt <-chan struct{}) bool {
	if f.m.cfg.Join == nil || fl.cachedLocked() != nil || fl.st != nil && fl.st.complete() {
		return true
	}
	st := fl.st
	fl.mu.Unlock()
	defer fl.mu.Lock()
	return !fl.joins(f.m.ctx, st) || !fl.join(f.m.ctx, interrupt)
}

// join waits for the staging's verified copy of the file (Config.Join, which asks the staging
// to fetch it next) until ctx ends or the kernel interrupts the request (its reader killed or
// signalled), and says whether it was the interrupt. Only the wait ends with the request,
// never a fetch other reads may share.
func (f *fileNode) join(ctx context.Context, interrupt <-chan struct{}) (interrupted bool) {
	wait, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		select {
		case <-interrupt:
			stop()
		case <-wait.Done():
		}
	}()
	f.m.cfg.Join(wait, f.line, f.obj)
	return ctx.Err() == nil && wait.Err() != nil
}

// passThrough registers the file's whole copy, if there is one, as its backing file, for the
// open being answered, and returns its ID (0: none).
func (f *rawFS) passThrough(id uint64, fl *fileNode) int32 {
	// The kernel holds the backing file itself from registration on: this process's descriptor
	// may be closed at once (the scratch file's), or by the bound (the cache's copy).
	var bid int32
	var errno syscall.Errno
	register := func(file *os.File) error {
		bid, errno = f.srv.RegisterBackingFd(&fuse.BackingMap{Fd: int32(file.Fd())})
		return nil
	}
	if fl.st != nil && fl.st.complete() {
		// Every part fetched and verified: the kernel reads the scratch file itself.
		sf, err := f.m.scratch.Open(fl.st.name)
		if err != nil {
			return 0
		}
		defer sf.Close()
		_ = register(sf)
	} else if h := fl.cachedLocked(); h == nil {
		return 0
	} else if err := h.use(register); err != nil {
		return 0
	}
	if errno != 0 {
		// Not root, or a kernel without passthrough: every read comes here.
		klog.Background().V(2).Info("streaming volume: no FUSE passthrough, reads are served by the plugin", "errno", errno)
		f.m.opens.noPassthrough.Store(true)
		return 0
	}
	if err := f.m.opens.record(id, bid); err != nil {
		klog.Background().Error(err, "streaming volume: recording a backing file", "key", fl.obj.Key)
		f.srv.UnregisterBackingFd(bid)
		return 0
	}
	if fl.backing == nil {
		fl.backing = f.newBacking(id, fl.obj.Key)
	}
	fl.backing.adopt(bid)
	return bid
}

// newBacking is node id's registration under the mount's bound. Its drop is recorded before
// the kernel hears of it: a process taking over in between keeps a registration no one uses
// (until the mount ends) rather than answering opens with an ID gone.
func (f *rawFS) newBacking(id uint64, key string) *backing {
	b := &backing{o: f.m.cfg.Files, drop: func(bid int32) {
		if err := f.m.opens.record(id, -bid); err != nil {
			klog.Background().Error(err, "streaming volume: recording a backing file dropped; a process taking the mount over would answer its opens with EIO", "key", key)
		}
		if errno := f.srv.UnregisterBackingFd(bid); errno != 0 {
			klog.Background().Error(errno, "streaming volume: dropping a backing file", "key", key)
		}
	}}
	f.m.trackBacking(b)
	return b
}

// Release counts the end of an open: one answered without passthrough, or one passed through
// (whose last release leaves the file's registration to the bound). Handles of an earlier
// process's opens carry another mark, and count nothing.
func (f *rawFS) Release(_ <-chan struct{}, in *fuse.ReleaseIn) {
	n := f.t.get(in.NodeId)
	if n == nil || n.file == nil {
		return
	}
	fl := n.file
	fl.mu.Lock()
	defer fl.mu.Unlock()
	switch {
	case in.Fh == f.epoch:
		fl.viaServer--
	case in.Fh == f.passedFh() && fl.backing != nil:
		fl.backing.release()
	}
}

// Read serves [off, off+len(dest)) once every part it touches is here and verified.
func (f *rawFS) Read(interrupt <-chan struct{}, in *fuse.ReadIn, dest []byte) (fuse.ReadResult, fuse.Status) {
	n := f.t.get(in.NodeId)
	switch {
	case f.refused():
		return nil, fuse.EIO
	case n == nil:
		return nil, errStale
	case n.file == nil:
		return nil, fuse.EISDIR
	}
	f.m.reads.Add(1)
	// The mount's context: fetches end with the mount; a wait for the staging also ends with
	// the request.
	res, errno := n.file.read(f.m.ctx, interrupt, dest, int64(in.Offset))
	return res, fuse.Status(errno)
}

func (f *fileNode) read(ctx context.Context, interrupt <-chan struct{}, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	end := min(off+int64(len(dest)), f.obj.Size)
	if off >= end {
		return fuse.ReadResultData(nil), 0
	}
	f.mu.Lock()
	st := f.st
	f.mu.Unlock()
	if st == nil || !st.holds(off, end) {
		// Opened before the staging committed the file: once it has, it is read from the cache
		// rather than fetched.
		if res, ok := f.readCached(ctx, dest, off, end); ok {
			return res, 0
		}
	}
	if f.m.cfg.Join != nil && f.joins(ctx, st) {
		// The staging fetches the file next, and the read waits for its verified copy rather
		// than downloading it a second time beside the staging.
		interrupted := f.join(ctx, interrupt)
		if res, ok := f.readCached(ctx, dest, off, end); ok {
			return res, 0
		}
		if interrupted {
			return nil, syscall.EINTR
		}
	}
	st, err := f.stream(ctx)
	if err == nil {
		err = st.ensure(ctx, f, off, end)
	}
	if err == nil {
		st.readAhead(f, off, end)
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "streaming read refused", "key", f.obj.Key, "off", off, "len", end-off)
		if source.KindOf(err) == source.Denied {
			return nil, syscall.EACCES // the source refuses the caller this file (an NFS file's mode)
		}
		return nil, syscall.EIO
	}
	n, err := st.scratch.readAt(dest[:end-off], off)
	if err != nil {
		klog.FromContext(ctx).Error(err, "streaming read: reading the scratch file", "key", f.obj.Key, "off", off)
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:n]), 0
}

// joinAlwaysUpTo is the largest file a read joins the staging for without asking its layout: the
// staging reads it in one GET (up to twice its 32 MiB chunk), so waiting for it costs about what
// fetching it would, and asking the layout would be one more request per file.
const joinAlwaysUpTo = 64 << 20

// joins reports whether a read of the file waits for the staging's download of it (Config.Join)
// rather than fetching it: always for a file this process fetched nothing of that is at most
// joinAlwaysUpTo; for a larger one only when it is checked as a whole anyway. Where the source
// gives per-part checksums, a read fetches only the parts it touches (its first byte comes after
// one part's GET, not after the whole object), and the staging goes on beside it.
func (f *fileNode) joins(ctx context.Context, st *stream) bool {
	if st == nil && f.obj.Size <= joinAlwaysUpTo {
		return true
	}
	if st == nil {
		var err error
		if st, err = f.stream(ctx); err != nil {
			return true // no layout: the staging's download is the one that can still come
		}
	}
	return st.whole && !st.have[0].Load()
}

// readCached reads [off, end) from the cache's copy of the file, if the cache holds it.
func (f *fileNode) readCached(ctx context.Context, dest []byte, off, end int64) (fuse.ReadResult, bool) {
	c := f.cachedFile()
	if c == nil {
		return nil, false
	}
	n, err := c.readAt(dest[:end-off], off)
	if err != nil {
		// Gone from the cache since (evicted while closed by the bound): fetched instead.
		klog.FromContext(ctx).V(2).Info("streaming read: the cache's copy cannot be read again", "key", f.obj.Key, "err", err)
		return nil, false
	}
	return fuse.ReadResultData(dest[:n]), true
}

// readAt reads all of dest at off. Into dest rather than a ReadResultFd: go-fuse reads from
// that descriptor after Read returns, when the bound may have closed it and the number gone to
// another volume's file.
func (h *handle) readAt(dest []byte, off int64) (int, error) {
	var n int
	err := h.use(func(f *os.File) error {
		var err error
		n, err = f.ReadAt(dest, off)
		return err
	})
	return n, err
}

// cachedFile returns the file's verified copy in the cache, once the cache holds all of it.
func (f *fileNode) cachedFile() *handle {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cachedLocked()
}

func (f *fileNode) cachedLocked() *handle {
	if f.cached != nil {
		return f.cached
	}
	c, err := f.m.cfg.Cached(f.obj)
	if err != nil {
		klog.Background().Error(err, "opening a cached file", "key", f.obj.Key)
	}
	if c == nil {
		return nil
	}
	// Opened again through Cached: its checks hold for every open.
	f.cached = f.m.cfg.Files.adopt(c, func() (*os.File, error) {
		c, err := f.m.cfg.Cached(f.obj)
		if err == nil && c == nil {
			err = fmt.Errorf("%q is no longer in the cache", f.obj.Key)
		}
		return c, err
	})
	f.m.trackFile(f.cached)
	return f.cached
}

// stream returns the file's on-demand state, asking the fetcher for its layout the first time.
// A failed layout is not remembered: the next read asks again.
func (f *fileNode) stream(ctx context.Context) (*stream, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.st != nil {
		return f.st, nil
	}
	ctx, cancel := context.WithTimeout(ctx, f.m.cfg.FetchTimeout)
	defer cancel()
	l, err := f.m.cfg.Fetcher.Layout(ctx, f.obj)
	if err != nil {
		return nil, err
	}
	parts, whole := l.Parts, false
	if !coversExactly(parts, f.obj.Size) {
		parts, whole = []source.Part{{Off: 0, N: f.obj.Size}}, true
	}
	// Not truncated: a process taking the mount over finds the scratch file of an earlier one,
	// which the kernel may read as a backing file. Its bytes are rewritten, verified and the
	// same, before this process hands any out.
	name := strconv.FormatInt(f.line, 10)
	file, err := f.m.scratch.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := file.Truncate(f.obj.Size); err != nil {
		file.Close()
		return nil, err
	}
	f.st = &stream{layout: l, parts: parts, whole: whole, locks: make([]sync.Mutex, len(parts)),
		have: make([]atomic.Bool, len(parts)), ahead: make([]atomic.Bool, len(parts)), name: name,
		// Opened again without O_CREATE: gone means the mount is.
		scratch: f.m.cfg.Files.adopt(file, func() (*os.File, error) { return f.m.scratch.OpenFile(name, os.O_RDWR, 0) })}
	f.st.last.Store(-1)
	f.m.track(f.st)
	return f.st, nil
}

// coversExactly reports whether parts tile [0, size) in order.
func coversExactly(parts []source.Part, size int64) bool {
	var off int64
	for _, p := range parts {
		if p.Off != off || p.N <= 0 {
			return false
		}
		off += p.N
	}
	return len(parts) > 0 && off == size
}

// stream is one file's bytes fetched on demand, in a scratch file; have[k] is set only once
// part k's bytes are written and verified. have[] lives here, not in the descriptor: closing the
// scratch file (the bound) and opening it again loses nothing fetched.
type stream struct {
	layout  Layout
	parts   []source.Part
	whole   bool // one part: the object checked as a whole
	locks   []sync.Mutex
	have    []atomic.Bool
	name    string  // the scratch file, in the mount's scratch directory
	scratch *handle // the scratch file, under the mount's OpenFiles
	// last is the part the last read ended in (-1 before any): a read starting there or in the
	// next part is sequential. Parts, not bytes: the kernel's read-ahead sends several reads at
	// once, which arrive in any order.
	last atomic.Int64
	// ahead marks the parts a read-ahead is fetching.
	ahead []atomic.Bool
}

// readAheadParts is how many parts past a sequential read are fetched in the background, so
// that a file read from start to end does not wait for one part after another.
const readAheadParts = 3

// readAhead starts fetching the parts after [off, end) when the read continues the previous one.
// They are checked as any part is; a failure is left for the read that needs the part.
func (s *stream) readAhead(f *fileNode, off, end int64) {
	if s.whole {
		return
	}
	first := int64(s.partAt(off))
	k := s.partAt(end - 1)
	if prev := s.last.Swap(int64(k)); first != prev && first != prev+1 {
		return
	}
	for j := k + 1; j < len(s.parts) && j <= k+readAheadParts; j++ {
		if s.have[j].Load() || !s.ahead[j].CompareAndSwap(false, true) {
			continue
		}
		go func() {
			defer s.ahead[j].Store(false)
			_ = s.fetchOnce(f.m.ctx, f, j)
		}()
	}
}

// partAt is the index of the part holding byte off.
func (s *stream) partAt(off int64) int {
	return sort.Search(len(s.parts), func(k int) bool { return s.parts[k].Off+s.parts[k].N > off })
}

// holds reports whether every part of [off, end) is here.
func (s *stream) holds(off, end int64) bool {
	first := sort.Search(len(s.parts), func(k int) bool { return s.parts[k].Off+s.parts[k].N > off })
	for k := first; k < len(s.parts) && s.parts[k].Off < end; k++ {
		if !s.have[k].Load() {
			return false
		}
	}
	return true
}

func (s *stream) complete() bool {
	for k := range s.have {
		if !s.have[k].Load() {
			return false
		}
	}
	return true
}

// ensure fetches the missing parts of [off, end), one at a time per part: a second reader of a
// part being fetched waits for it rather than fetching it again.
func (s *stream) ensure(ctx context.Context, f *fileNode, off, end int64) error {
	first := sort.Search(len(s.parts), func(k int) bool { return s.parts[k].Off+s.parts[k].N > off })
	for k := first; k < len(s.parts) && s.parts[k].Off < end; k++ {
		if s.have[k].Load() {
			continue
		}
		if err := s.fetchOnce(ctx, f, k); err != nil {
			return err
		}
	}
	return nil
}

func (s *stream) fetchOnce(ctx context.Context, f *fileNode, k int) error {
	s.locks[k].Lock()
	defer s.locks[k].Unlock()
	if s.have[k].Load() {
		return nil
	}
	start := time.Now()
	err := s.fetch(ctx, f, k)
	if cb := f.m.cfg.OnFetch; cb != nil {
		cb(f.obj.Key, s.parts[k].Off, s.parts[k].N, err)
	}
	if err != nil {
		return err
	}
	s.have[k].Store(true)
	klog.FromContext(ctx).V(4).Info("fetched on demand", "key", f.obj.Key, "off", s.parts[k].Off,
		"bytes", s.parts[k].N, "duration", time.Since(start))
	return nil
}

// fetch reads part k into the scratch file, checked; an object nothing checks goes to the policy.
func (s *stream) fetch(ctx context.Context, f *fileNode, k int) error {
	p := s.parts[k]
	ctx, cancel := context.WithTimeout(ctx, f.m.cfg.FetchTimeout)
	defer cancel()
	if room := f.m.cfg.Room; room != nil {
		if err := room(ctx, p.N); err != nil {
			return err
		}
	}
	err := s.read(ctx, f, p)
	if source.KindOf(err) == source.Unverifiable && len(s.layout.PartSizes) > 0 {
		// Matched under no likely part size: read again, so that bytes damaged on the way are
		// not taken for an unusual part size.
		err = s.read(ctx, f, p)
	}
	if source.KindOf(err) == source.Unverifiable && f.m.cfg.Unverifiable != nil {
		err = f.m.cfg.Unverifiable(ctx, f.obj, err)
	}
	return err
}

// read reads part p into the scratch file, checking it as it streams.
func (s *stream) read(ctx context.Context, f *fileNode, p source.Part) error {
	rc, err := f.m.cfg.Fetcher.Open(ctx, f.obj, p.Off, p.N)
	if err != nil {
		return err
	}
	defer rc.Close()
	var c checker
	if s.whole {
		c = wholeChecker(f.obj, s.layout, rc)
	} else if c, err = partChecker(f.obj, p); err != nil {
		return err
	}
	// 1 MiB writes rather than io.Copy's 32 KiB: a whole large object takes fewer syscalls.
	buf := make([]byte, min(p.N+1, 1<<20))
	n, err := io.CopyBuffer(io.MultiWriter(&scratchWriter{h: s.scratch, off: p.Off}, c), io.LimitReader(rc, p.N+1), buf)
	if err != nil {
		return err
	}
	if n != p.N {
		return source.Errorf(source.Corrupt, "%q bytes %d-%d: got %d bytes, want %d", f.obj.Key, p.Off, p.Off+p.N-1, n, p.N)
	}
	return c.check()
}

// scratchWriter writes at off onward in a scratch file, holding its descriptor only for each
// write: a slow fetch does not keep it from the bound.
type scratchWriter struct {
	h   *handle
	off int64
}

func (w *scratchWriter) Write(b []byte) (int, error) {
	var n int
	err := w.h.use(func(f *os.File) error {
		var err error
		n, err = f.WriteAt(b, w.off)
		return err
	})
	w.off += int64(n)
	return n, err
}
