//go:build cgo && libnfs

package nfs4source

/*
#cgo pkg-config: libnfs
#include <stdlib.h>
#include <fcntl.h>
#include <errno.h>
#include <nfsc/libnfs.h>
#include <nfsc/libnfs-raw.h>
#include <nfsc/libnfs-raw-nfs4.h>

// cistern_readdir returns the next entry's name and mode (type and permission bits), or NULL.
static const char *cistern_readdir(struct nfs_context *nfs, struct nfsdir *dir, uint32_t *mode) {
	struct nfsdirent *e = nfs_readdir(nfs, dir);
	if (e == NULL) return NULL;
	*mode = e->mode;
	return e->name;
}
*/
import "C"

import (
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// conn is one libnfs context: a TCP connection, an NFSv4 client ID, and the mounted directory.
// libnfs contexts are not safe for concurrent use: a conn has one user at a time.
type conn struct {
	nfs *C.struct_nfs_context
	// renewed is when the client's NFSv4.0 lease was last renewed: at SETCLIENTID (the mount),
	// and by every OPEN, READ and CLOSE since; LOOKUP, GETATTR and READDIR renew nothing.
	renewed time.Time
}

var conns atomic.Uint64

// stat is what Cistern reads of nfs_stat_64.
type stat struct {
	mode             uint32 // type and permission bits
	size, ino, dev   uint64
	mtime, mtimeNsec uint64
}

func (s *stat) isDir() bool  { return s.mode&syscall.S_IFMT == syscall.S_IFDIR }
func (s *stat) isReg() bool  { return s.mode&syscall.S_IFMT == syscall.S_IFREG }
func (s *stat) isLink() bool { return s.mode&syscall.S_IFMT == syscall.S_IFLNK }

// dial connects to host and mounts dir as uid/gid. Each context has a client name of its own:
// libnfs names them by pid and second, and NFSv4.0 servers take a second SETCLIENTID under one
// name with another verifier for a reboot of that client, dropping the first one's opens.
func dial(host, dir string, uid, gid uint32) (*conn, error) {
	nfs := C.nfs_init_context()
	if nfs == nil {
		return nil, fmt.Errorf("libnfs: cannot create a context")
	}
	c := &conn{nfs: nfs}
	if rc := C.nfs_set_version(nfs, C.NFS_V4); rc != 0 {
		defer c.close()
		return nil, c.err(rc)
	}
	C.nfs_set_uid(nfs, C.int(uid))
	C.nfs_set_gid(nfs, C.int(gid))
	C.nfs_set_timeout(nfs, 60_000)  // a server that stops answering fails the call, not hangs it
	C.nfs_set_autoreconnect(nfs, 0) // a new connection needs a new client ID: callers dial again
	C.nfs_set_dircache(nfs, 0)      // listings are read from the server, never from a cache
	hostname, _ := os.Hostname()
	name := C.CString(fmt.Sprintf("cistern %s pid %d conn %d", hostname, os.Getpid(), conns.Add(1)))
	C.nfs4_set_client_name(nfs, name) // copied
	C.free(unsafe.Pointer(name))
	var verifier [C.NFS4_VERIFIER_SIZE]byte
	_, _ = rand.Read(verifier[:])
	C.nfs4_set_verifier(nfs, (*C.char)(unsafe.Pointer(&verifier[0])))
	server := host
	if h, port, err := net.SplitHostPort(host); err == nil {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			c.close()
			return nil, fmt.Errorf("bad port in %q", host)
		}
		// libnfs 4.0 sets the NFS port from a URL only.
		u := C.CString("nfs://" + h + "/?nfsport=" + port)
		url := C.nfs_parse_url_incomplete(nfs, u)
		C.free(unsafe.Pointer(u))
		if url == nil {
			defer c.close()
			return nil, c.err(-C.EINVAL)
		}
		C.nfs_destroy_url(url)
		server = h
	}
	cs, cd := C.CString(server), C.CString(dir)
	defer C.free(unsafe.Pointer(cs))
	defer C.free(unsafe.Pointer(cd))
	if rc := C.nfs_mount(nfs, cs, cd); rc != 0 {
		defer c.close()
		return nil, c.err(rc)
	}
	c.renewed = time.Now()
	return c, nil
}

// err is the failure of a call that returned rc (a negated errno).
func (c *conn) err(rc C.int) error {
	msg := ""
	if m := C.nfs_get_error(c.nfs); m != nil {
		msg = C.GoString(m)
	}
	return &libnfsError{errno: syscall.Errno(-rc), msg: msg}
}

func (c *conn) close() {
	C.nfs_destroy_context(c.nfs)
	c.nfs = nil
}

func fromC(st *C.struct_nfs_stat_64) stat {
	return stat{mode: uint32(st.nfs_mode), size: uint64(st.nfs_size), ino: uint64(st.nfs_ino),
		dev: uint64(st.nfs_dev), mtime: uint64(st.nfs_mtime), mtimeNsec: uint64(st.nfs_mtime_nsec)}
}

// lstat reads p's attributes, a symlink's own.
func (c *conn) lstat(p string) (stat, error) {
	cp := C.CString(p)
	defer C.free(unsafe.Pointer(cp))
	var st C.struct_nfs_stat_64
	if rc := C.nfs_lstat64(c.nfs, cp, &st); rc != 0 {
		return stat{}, c.err(rc)
	}
	return fromC(&st), nil
}

// entry is a directory entry: its name and its type and permission bits.
type entry struct {
	name string
	mode uint32
}

// readDir reads the whole directory p (libnfs reads it at opendir).
func (c *conn) readDir(p string) ([]entry, error) {
	cp := C.CString(p)
	defer C.free(unsafe.Pointer(cp))
	var dir *C.struct_nfsdir
	if rc := C.nfs_opendir(c.nfs, cp, &dir); rc != 0 {
		return nil, c.err(rc)
	}
	defer C.nfs_closedir(c.nfs, dir)
	var out []entry
	for {
		var mode C.uint32_t
		name := C.cistern_readdir(c.nfs, dir, &mode)
		if name == nil {
			return out, nil
		}
		if n := C.GoString(name); n != "." && n != ".." {
			out = append(out, entry{name: n, mode: uint32(mode)})
		}
	}
}

func (c *conn) readlink(p string) (string, error) {
	cp := C.CString(p)
	defer C.free(unsafe.Pointer(cp))
	var buf *C.char
	if rc := C.nfs_readlink2(c.nfs, cp, &buf); rc != 0 {
		return "", c.err(rc)
	}
	defer C.free(unsafe.Pointer(buf))
	return C.GoString(buf), nil
}

// file is an open file of a conn.
type file struct {
	c  *conn
	fh *C.struct_nfsfh
}

// open opens p for reading; a symlink there is refused (ELOOP), never followed.
func (c *conn) open(p string) (*file, error) {
	cp := C.CString(p)
	defer C.free(unsafe.Pointer(cp))
	var fh *C.struct_nfsfh
	if rc := C.nfs_open(c.nfs, cp, C.O_RDONLY|C.O_NOFOLLOW, &fh); rc != 0 {
		return nil, c.err(rc)
	}
	c.renewed = time.Now()
	return &file{c: c, fh: fh}, nil
}

func (f *file) stat() (stat, error) {
	var st C.struct_nfs_stat_64
	if rc := C.nfs_fstat64(f.c.nfs, f.fh, &st); rc != 0 {
		return stat{}, f.c.err(rc)
	}
	return fromC(&st), nil
}

// pread reads up to len(p) bytes at off (one READ: fewer bytes than asked is no error).
func (f *file) pread(p []byte, off int64) (int, error) {
	rc := C.nfs_pread(f.c.nfs, f.fh, C.uint64_t(off), C.uint64_t(len(p)), unsafe.Pointer(&p[0]))
	if rc < 0 {
		return 0, f.c.err(rc)
	}
	f.c.renewed = time.Now()
	return int(rc), nil
}

func (f *file) close() error {
	if rc := C.nfs_close(f.c.nfs, f.fh); rc != 0 {
		return f.c.err(rc)
	}
	return nil
}
