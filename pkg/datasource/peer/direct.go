package peer

// Pieces of large files are read with direct I/O (O_DIRECT). The staging engine writes those
// files so (stage/direct.go), so a piece a node serves is not in its page cache: a buffered read
// first fills the cache, then copies out of it, and a node copying its share of a 2 GiB object to
// 3 peers spent a tenth of its CPU in those reads (docs/benchmarks.md, "Peer fan-out"). Read
// directly, the device writes into the copy buffer and the page cache is left to the node's
// workloads. A filesystem that refuses direct I/O, or a read it refuses, gets buffered reads.

import (
	"errors"
	"io"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	directAlign = 4096
	// directMinSize matches the staging engine's: smaller files are written, and read, through
	// the page cache.
	directMinSize = 8 << 20
)

// alignedBuf returns n bytes starting on a directAlign boundary.
func alignedBuf(n int) []byte {
	b := make([]byte, n+directAlign)
	skip := (directAlign - int(uintptr(unsafe.Pointer(&b[0]))&(directAlign-1))) & (directAlign - 1)
	return b[skip : skip+n : skip+n]
}

func alignUp(n int64) int64 { return (n + directAlign - 1) &^ (directAlign - 1) }

func aligned(p []byte) bool {
	return cap(p) > 0 && uintptr(unsafe.Pointer(&p[:1][0]))&(directAlign-1) == 0
}

// directPiece reads [off, end) of f, which is open for direct I/O. Reads into aligned memory
// with room for whole blocks (the server's copy buffers) go straight to the device; others go
// through a buffer of its own.
type directPiece struct {
	f        *os.File
	off, end int64
	buf      []byte
	buffered bool // direct I/O refused: f is back to buffered reads
}

// openDirect returns a reader of [off, off+n) of f by direct I/O, or nil when the piece does
// not start on a block or f cannot be switched to direct I/O (f is unchanged then).
func openDirect(f *os.File, off, n int64) *directPiece {
	if off%directAlign != 0 || setDirect(f, true) != nil {
		return nil
	}
	return &directPiece{f: f, off: off, end: off + n}
}

func setDirect(f *os.File, on bool) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	err = rc.Control(func(fd uintptr) {
		var fl int
		if fl, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0); ferr != nil {
			return
		}
		if on {
			fl |= unix.O_DIRECT
		} else {
			fl &^= unix.O_DIRECT
		}
		_, ferr = unix.FcntlInt(fd, unix.F_SETFL, fl)
	})
	return errors.Join(err, ferr)
}

func (d *directPiece) Read(p []byte) (int, error) {
	if d.off >= d.end {
		return 0, io.EOF
	}
	want := int(min(int64(len(p)), d.end-d.off))
	if want == 0 {
		return 0, nil
	}
	if d.buffered {
		return d.readBuffered(p[:want])
	}
	dst := p
	if !aligned(p) || alignUp(int64(want)) > int64(len(p)) {
		if d.buf == nil {
			d.buf = alignedBuf(copyChunk)
		}
		want = min(want, len(d.buf))
		dst = d.buf
	}
	// Whole blocks: the file's last one reads short, which is what is wanted.
	m, err := d.f.ReadAt(dst[:alignUp(int64(want))], d.off)
	if m < want && errors.Is(err, syscall.EINVAL) && setDirect(d.f, false) == nil {
		d.buffered = true
		return d.readBuffered(p[:want])
	}
	if m < want {
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, err
	}
	if &dst[0] != &p[0] {
		copy(p, dst[:want])
	}
	d.off += int64(want)
	return want, nil
}

func (d *directPiece) readBuffered(p []byte) (int, error) {
	m, err := d.f.ReadAt(p, d.off)
	d.off += int64(m)
	if err == io.EOF && m == len(p) {
		err = nil
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return m, err
}

func (d *directPiece) Close() error { return d.f.Close() }
