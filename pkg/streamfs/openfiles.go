package streamfs

import (
	"container/list"
	"os"
	"sync"
	"sync/atomic"

	"k8s.io/klog/v2"
)

// DefaultMaxOpenFiles is the bound on the files streaming volumes hold open when none is given: well under the usual 1,048,576 open files of a container, and above the working set
// of files a training job reads at once.
const DefaultMaxOpenFiles = 4096

// OpenFiles bounds the files that streaming volumes hold open: the descriptors of the cache's
// copy of a file and of its scratch file, and the files registered with the kernel as backing
// files (backing.go), which the kernel holds open itself. Each file a pod reads would otherwise
// keep one open until its volume goes, so a pod reading many files could run the plugin out of
// descriptors (EMFILE), or the kernel out of open files, and break every volume of the node.
// Past the bound, the file least recently used is closed; it is opened (or registered) again
// when next read. One OpenFiles is shared by every mount of a node plugin.
//
// A file being read or written is never closed, nor a registration an open file holds: while
// every open one is in use, the bound is exceeded by as many as are in use (as many as the
// requests being served, and the files the pods hold open), until they end.
type OpenFiles struct {
	max    int
	mu     sync.Mutex
	idle   list.List // of entry: open, in use by no one, least recently used at the front
	open   int       // handles with a file open, and registrations
	closed atomic.Int64
}

// NewOpenFiles returns a bound of max descriptors (DefaultMaxOpenFiles if max <= 0).
func NewOpenFiles(max int) *OpenFiles {
	if max <= 0 {
		max = DefaultMaxOpenFiles
	}
	return &OpenFiles{max: max}
}

// entry is what the bound closes: a descriptor (*handle) or a registration (*backing).
type entry interface{ closeLocked() }

// Closed is how many files the bound closed (or registrations it dropped) so that others could
// be opened.
func (o *OpenFiles) Closed() int64 { return o.closed.Load() }

// Open is how many files under the bound are open: descriptors, and registrations.
func (o *OpenFiles) Open() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.open
}

// handle is one file under the bound: open, or closed by it and opened again with reopen.
type handle struct {
	o      *OpenFiles
	reopen func() (*os.File, error)
	f      *os.File
	users  int
	elem   *list.Element // in o.idle while open and unused
	gone   bool
}

// adopt puts f, just opened, under the bound; reopen opens the same file again.
func (o *OpenFiles) adopt(f *os.File, reopen func() (*os.File, error)) *handle {
	h := &handle{o: o, reopen: reopen, f: f}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.evictLocked(1)
	o.open++
	h.elem = o.idle.PushBack(h)
	return h
}

// use runs fn with the file open: it is not closed before fn returns. fn must not keep it.
func (h *handle) use(fn func(*os.File) error) error {
	f, err := h.acquire()
	if err != nil {
		return err
	}
	defer h.release()
	return fn(f)
}

func (h *handle) acquire() (*os.File, error) {
	o := h.o
	o.mu.Lock()
	defer o.mu.Unlock()
	if h.gone {
		return nil, os.ErrClosed
	}
	if h.f == nil {
		o.evictLocked(1)
		f, err := h.reopen()
		if err != nil {
			return nil, err
		}
		h.f = f
		o.open++
	} else if h.elem != nil {
		o.idle.Remove(h.elem)
		h.elem = nil
	}
	h.users++
	return h.f, nil
}

func (h *handle) release() {
	o := h.o
	o.mu.Lock()
	defer o.mu.Unlock()
	if h.users--; h.users > 0 {
		return
	}
	if h.gone {
		h.closeLocked()
		return
	}
	h.elem = o.idle.PushBack(h)
	// Back under the bound after a time when more were in use than it allows.
	o.evictLocked(0)
}

// close closes the file for good (its mount is gone), or at the end of its last use.
func (h *handle) close() {
	o := h.o
	o.mu.Lock()
	defer o.mu.Unlock()
	h.gone = true
	if h.users == 0 {
		h.closeLocked()
	}
}

func (h *handle) closeLocked() {
	if h.elem != nil {
		h.o.idle.Remove(h.elem)
		h.elem = nil
	}
	if h.f != nil {
		h.f.Close()
		h.f = nil
		h.o.open--
	}
}

// evictLocked closes idle files, least recently used first, until n more fit under the bound.
func (o *OpenFiles) evictLocked(n int) {
	for o.open+n > o.max && o.idle.Len() > 0 {
		o.idle.Front().Value.(entry).closeLocked()
		if o.closed.Add(1) == 1 {
			// Once: past it, closes are the bound at work, counted in Closed.
			klog.Background().Info("streaming volumes reached their bound of open files: the least recently read are closed, and opened again when read",
				"maxOpenFiles", o.max)
		}
	}
}
