package peer

// Pieces served from a mapping of their file: the server hands the TLS connection the file's
// pages rather than reading them into a buffer first. That read is a copy and a system call per
// chunk: 9% of the nodes' CPU when 4 nodes fetch 2 GiB from each other (docs/benchmarks.md,
// "Peer fan-out").

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"golang.org/x/sys/unix"
)

// minMapped is the smallest piece served from a mapping: below it, mapping costs more than the
// copy it saves.
const minMapped = 1 << 20

// mappedPiece is [off, off+n) of an open file, mapped read-only.
type mappedPiece struct {
	f    *os.File
	mem  []byte // the mapping, from a page boundary
	data []byte // the piece
	read int
}

// mapPiece maps [off, off+n) of f; false when the piece is small or the file cannot be mapped
// (the caller then reads it). The pages are read in at once (MAP_POPULATE): a piece is sent
// whole, and faults on each page would cost more than the read they replace.
func mapPiece(f *os.File, off, n int64) (*mappedPiece, bool) {
	if n < minMapped {
		return nil, false
	}
	page := int64(os.Getpagesize())
	start := off &^ (page - 1)
	mem, err := unix.Mmap(int(f.Fd()), start, int(off+n-start), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, false
	}
	return &mappedPiece{f: f, mem: mem, data: mem[off-start:]}, true
}

// Read copies the piece out, for readers other than the server's copy.
func (m *mappedPiece) Read(p []byte) (n int, err error) {
	if m.read >= len(m.data) {
		return 0, io.EOF
	}
	err = noFault(func() { n = copy(p, m.data[m.read:]) })
	m.read += n
	return n, err
}

// Close unmaps the piece and closes its file.
func (m *mappedPiece) Close() error {
	err := unix.Munmap(m.mem)
	m.mem, m.data = nil, nil
	if cerr := m.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// noFault runs fn, which touches a mapping, and returns a fault on it as an error: a page that
// cannot be read in (an I/O error, or a file cut short under the mapping) raises SIGBUS, which
// would otherwise end the node plugin. Any other panic goes on.
func noFault(fn func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if f, ok := r.(interface{ Addr() uintptr }); ok {
			err = fmt.Errorf("reading a mapped piece: fault at %#x", f.Addr())
			return
		}
		panic(r)
	}()
	fn()
	return nil
}
