package stage

import (
	"errors"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"golang.org/x/sys/unix"
)

// Large files are written with direct I/O (O_DIRECT). A staged dataset is a stream of bytes that
// is not read again soon; through the page cache every new page costs an allocation and a copy
// (on a virtual machine often a fault to the host as well) and pushes out pages the node's
// workloads use. On the 2-core test VM, writing a 2 GiB object took 2-6 s of system time
// buffered and 0.3-0.5 s direct.
//
// Direct I/O needs aligned memory, offsets and lengths: copy buffers are page-aligned, parallel
// ranges start on MiB boundaries, and the last block of a file is padded with zeros, then cut off
// when the file is complete. A filesystem that refuses direct I/O gets buffered writes.

const (
	directAlign = 4096
	// directMinSize: files of two copy buffers or more, whose copy is pipelined (copyPipelined):
	// the next buffer is read while a direct write waits for the device. Smaller files go
	// through the page cache, where a write costs no device round trip (direct I/O for 32 KiB
	// files was slower). Between 2 and 8 MiB (the bound before), staging 64 × 4 MiB buffered
	// spent most of the node plugin's CPU in the page cache: copying into new pages and, on a
	// busy machine, compacting memory to allocate them (docs/benchmarks.md, "VolumeManager").
	directMinSize = 2 * copyBufSize
)

// alignedBuf returns n bytes starting on a directAlign boundary.
func alignedBuf(n int) []byte {
	b := make([]byte, n+directAlign)
	skip := (directAlign - int(uintptr(unsafe.Pointer(&b[0]))&(directAlign-1))) & (directAlign - 1)
	return b[skip : skip+n : skip+n]
}

func alignUp(n int64) int64 { return (n + directAlign - 1) &^ (directAlign - 1) }

// output is a file being downloaded, written directly or through the page cache.
type output struct {
	f      *os.File
	size   int64 // the object's size; a padded last block goes beyond it until finish
	direct atomic.Bool
	padded atomic.Bool
}

// newOutput wraps f; with direct it tries to switch f to direct I/O.
func newOutput(f *os.File, size int64, direct bool) *output {
	o := &output{f: f, size: size}
	if direct && setDirect(f, true) == nil {
		o.direct.Store(true)
	}
	return o
}

func setDirect(f *os.File, on bool) error {
	fd := int(f.Fd())
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	if on {
		fl |= unix.O_DIRECT
	} else {
		fl &^= unix.O_DIRECT
	}
	_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl)
	return err
}

// chunk returns how much of the k bytes read into buf (cap permitting) to write at off, and how
// many of them are data: with direct I/O, whole blocks only, except that the file's last bytes
// are padded to a block.
func (o *output) chunk(buf []byte, k int, off int64) (write, data int) {
	if !o.direct.Load() {
		return k, k
	}
	if off+int64(k) == o.size && off%directAlign == 0 {
		w := int(alignUp(int64(k)))
		if w <= cap(buf) {
			clear(buf[k:w])
			return w, k
		}
	}
	k &^= directAlign - 1 // the rest is read again
	return k, k
}

// writeAt writes b at off. A direct write the filesystem refuses (EINVAL: an alignment it does
// not take) is done again buffered, and the file stays buffered.
func (o *output) writeAt(b []byte, off int64) error {
	if off+int64(len(b)) > o.size {
		o.padded.Store(true)
	}
	_, err := o.f.WriteAt(b, off)
	if errors.Is(err, syscall.EINVAL) && o.direct.Load() {
		o.direct.Store(false)
		if err := setDirect(o.f, false); err != nil {
			return err
		}
		_, err = o.f.WriteAt(b, off)
	}
	return cache.WriteErr(err)
}

// finish cuts off the padding of the last block.
func (o *output) finish() error {
	if o.padded.Load() {
		return o.f.Truncate(o.size)
	}
	return nil
}
