package streamfs

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Mount is a dataset served at a directory.
type Mount struct {
	Dir     string
	server  *fuse.Server
	conn    string // the FUSE connection's name in the control filesystem
	dev     *os.File
	initReq []byte // the kernel's INIT, for Conn
	*mount
}

// mount is what the files of one mount share.
type mount struct {
	cfg Config
	// scratch is Config.Scratch, held from the start: the directory the mount's fetched bytes
	// go to stays the mount's, wherever it is moved (its dataset version retired, say).
	scratch *os.Root
	// ctx ends with the mount: fetches stop.
	ctx     context.Context
	cancel  context.CancelFunc
	mu      sync.Mutex
	streams []*stream
	files   []*handle // cached files reads found in the cache
	// backings are the files' registrations as backing files (passThrough, openLog.apply).
	backings []*backing
	// reads counts the reads that reached this process (not those the kernel passed through).
	reads atomic.Int64
	opens *openLog
}

// Reads is how many reads reached the filesystem's server: a file passed through to the kernel
// adds none.
func (mt *Mount) Reads() int64 { return mt.reads.Load() }

func (m *mount) track(s *stream) {
	m.mu.Lock()
	m.streams = append(m.streams, s)
	m.mu.Unlock()
}

func (m *mount) trackFile(f *handle) {
	m.mu.Lock()
	m.files = append(m.files, f)
	m.mu.Unlock()
}

func (m *mount) trackBacking(b *backing) {
	m.mu.Lock()
	m.backings = append(m.backings, b)
	m.mu.Unlock()
}

// Subtype is the streaming filesystem's FUSE subtype: its mounts are of type "fuse." + Subtype.
const Subtype = "cistern-stream"

// options are the mount's: the directory entries and attributes never change, so the kernel
// caches them for long (rawFS); reads of up to 1 MiB per request (the default is 128 KiB):
// fewer round trips.
func options() *fuse.MountOptions {
	return &fuse.MountOptions{FsName: "cistern", Name: Subtype, MaxReadAhead: 1 << 20,
		MaxWrite: 1 << 20, DisableXAttrs: true}
}

func (cfg *Config) check() error {
	if cfg.Fetcher == nil || cfg.Cached == nil || cfg.Scratch == "" {
		return errors.New("streamfs: Fetcher, Cached and Scratch are required")
	}
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = 10 * time.Minute
	}
	return os.MkdirAll(cfg.Scratch, 0o700)
}

// Start mounts the dataset read-only at dir and serves it until Close.
func Start(dir string, cfg Config) (*Mount, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return nil, err
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening /dev/fuse: %w", err)
	}
	dev := os.NewFile(uintptr(fd), "/dev/fuse")
	// Pods run as any user; the node plugin is the only server.
	data := fmt.Sprintf("fd=%d,rootmode=%o,user_id=%d,group_id=%d,max_read=%d,allow_other",
		fd, st.Mode&unix.S_IFMT, os.Geteuid(), os.Getegid(), options().MaxWrite)
	if err := unix.Mount("cistern", dir, "fuse."+Subtype, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_RDONLY, data); err != nil {
		dev.Close()
		return nil, fmt.Errorf("mounting the streaming filesystem at %s: %w", dir, err)
	}
	scratch, err := os.OpenRoot(cfg.Scratch)
	if err == nil {
		var opens *openLog
		if opens, err = newOpenLog(scratch); err == nil {
			var mt *Mount
			if mt, err = serve(dir, dev, nil, cfg, scratch, opens); err == nil {
				return mt, nil
			}
			opens.f.Close()
		}
		scratch.Close()
	}
	_ = unix.Unmount(dir, unix.MNT_DETACH)
	dev.Close()
	return nil, err
}

// Conn is what another process needs to serve a mount after this one: the FUSE descriptor and
// the kernel's INIT request (sent once per connection) with the manifest it answered.
type Conn struct {
	// Dev is a copy of the mount's /dev/fuse descriptor: the connection lives as long as one
	// copy is open, whatever becomes of the process serving it.
	Dev *os.File `json:"-"`
	// Init is the kernel's INIT request, replayed to the next server.
	Init []byte `json:"init"`
	// Manifest names the manifest whose node IDs the kernel holds.
	Manifest string `json:"manifest"`
	// Name is the connection's name in the FUSE control filesystem: a process taking over
	// checks that the mount at its directory is still this connection (ConnOf).
	Name string `json:"name"`
}

// Conn returns what a process taking the mount over needs (Resume). The caller closes Dev.
func (mt *Mount) Conn() (Conn, error) {
	fd, err := unix.FcntlInt(mt.dev.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return Conn{}, err
	}
	return Conn{Dev: os.NewFile(uintptr(fd), "/dev/fuse"), Init: mt.initReq, Manifest: manifestID(mt.cfg.Objects), Name: mt.conn}, nil
}

// Resume serves the mount at dir again over c, the connection of a server that is gone: the
// kernel kept the mount (reads meanwhile wait), and asked to resend the requests the old server
// had read but not answered. cfg must name the same manifest and scratch directory. Takes c.Dev.
func Resume(dir string, c Conn, cfg Config) (*Mount, error) {
	defer c.Dev.Close()
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if id := manifestID(cfg.Objects); id != c.Manifest {
		return nil, fmt.Errorf("streamfs: the mount at %s serves manifest %.12s, not %.12s", dir, c.Manifest, id)
	}
	scratch, err := os.OpenRoot(cfg.Scratch)
	if err != nil {
		return nil, err
	}
	opens, err := resumeOpenLog(scratch)
	if err != nil {
		scratch.Close()
		return nil, err
	}
	mt, err := takeOver(dir, c, cfg, scratch, opens)
	if err != nil {
		opens.f.Close()
		scratch.Close()
	}
	return mt, err
}

// Refuse serves the mount at dir over c, the connection of a server that is gone, without
// serving any data: every lookup, attribute, open, listing and read answers EIO. It is for a
// mount whose caller's access cannot be proved again (its credentials lost, or refused): its
// readers get a clean error rather than a hang or "transport endpoint is not connected", and
// nothing is served without the proof. Files the kernel passed through before keep being read
// by the kernel from their backing files (opened while the proof held). Takes c.Dev.
func Refuse(dir string, c Conn, reason string) (*Mount, error) {
	defer c.Dev.Close()
	klog.Background().Info("streaming volume: every read answers EIO", "dir", dir, "reason", reason)
	return takeOver(dir, c, Config{refused: reason}, nil, &openLog{})
}

// takeOver serves c at dir and asks the kernel to resend what the old server left unanswered.
func takeOver(dir string, c Conn, cfg Config, scratch *os.Root, opens *openLog) (*Mount, error) {
	if len(c.Init) < int(unsafe.Sizeof(fuse.InHeader{})) {
		return nil, errors.New("streamfs: no INIT request to resume with")
	}
	fd, err := unix.FcntlInt(c.Dev.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	dev := os.NewFile(uintptr(fd), "/dev/fuse")
	mt, err := serve(dir, dev, c.Init, cfg, scratch, opens)
	if err != nil {
		dev.Close()
		return nil, err
	}
	// The kernel puts back the requests the old server took and never answered; a kernel
	// without FUSE_NOTIFY_RESEND (before 6.9) leaves them, and their callers, waiting.
	resend := make([]byte, 16)
	binary.NativeEndian.PutUint32(resend[0:], 16)
	// A notification's code goes positive in the error field (go-fuse's constants are negated).
	binary.NativeEndian.PutUint32(resend[4:], uint32(-fuse.NOTIFY_RESEND))
	if _, err := unix.Write(int(dev.Fd()), resend); err != nil {
		klog.Background().Error(err, "streaming volume: the kernel resent nothing; reads the old server took may hang", "dir", dir)
	}
	return mt, nil
}

// serve answers the connection on dev for the mount at dir. go-fuse reads the kernel's INIT
// itself from a fresh connection; for one taken over, it is given the recorded INIT on a socket
// standing in for the device, which the device then replaces under the same descriptor number.
func serve(dir string, dev *os.File, initReq []byte, cfg Config, scratch *os.Root, opens *openLog) (*Mount, error) {
	if cfg.Files == nil {
		cfg.Files = NewOpenFiles(DefaultMaxOpenFiles)
	}
	m := &mount{cfg: cfg, scratch: scratch, opens: opens}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	var epoch [8]byte
	_, _ = rand.Read(epoch[:])
	fs := &rawFS{RawFileSystem: fuse.NewDefaultRawFileSystem(), m: m,
		epoch: binary.NativeEndian.Uint64(epoch[:]) | 1}
	fs.t = buildTree(m.ctx, m)
	opens.apply(fs.t, m)
	first, err := unix.FcntlInt(dev.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		m.cancel()
		return nil, err
	}
	if initReq != nil {
		sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err == nil {
			_, err = unix.Write(sp[1], initReq)
		}
		if err != nil {
			unix.Close(first)
			m.cancel()
			return nil, fmt.Errorf("replaying INIT: %w", err)
		}
		defer unix.Close(sp[1])
		unix.Close(first)
		first = sp[0]
	}
	server, err := fuse.NewServer(fs, "/dev/fd/"+strconv.Itoa(first), options())
	if err != nil {
		m.cancel()
		return nil, fmt.Errorf("serving the streaming filesystem at %s: %w", dir, err)
	}
	if initReq != nil {
		if err := unix.Dup3(int(dev.Fd()), first, unix.O_CLOEXEC); err != nil {
			m.cancel()
			return nil, fmt.Errorf("taking over the FUSE connection: %w", err)
		}
	} else {
		ks := server.KernelSettings()
		b := unsafe.Slice((*byte)(unsafe.Pointer(ks)), unsafe.Sizeof(*ks))
		initReq = append([]byte(nil), b[:min(uintptr(ks.Length), uintptr(len(b)))]...)
	}
	go server.Serve()
	if err := pollOnce(dir); err != nil {
		m.cancel()
		return nil, fmt.Errorf("probing the streaming filesystem at %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		m.cancel()
		return nil, fmt.Errorf("reading the streaming filesystem at %s: %w", dir, err)
	}
	return &Mount{Dir: dir, server: server, mount: m, conn: connName(st.Dev), dev: dev, initReq: initReq}, nil
}

// pollHackName is the name go-fuse answers for itself (see pollOnce).
const pollHackName = ".go-fuse-epoll-hack"

// pollOnce makes the kernel send one POLL, which go-fuse answers ENOSYS, so that it never asks
// again. Otherwise a file of the mount opened in this process (the node plugin reads its own
// volumes in tests) goes through the Go runtime's epoll_ctl, whose POLL request can wait for a
// server stuck behind the same runtime lock. go-fuse does this itself, except for the
// /dev/fd/N mounts this package makes.
func pollOnce(dir string) error {
	fd, err := unix.Open(filepath.Join(dir, pollHackName), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLPRI | unix.POLLOUT}}, 0)
	return nil
}

// connName is the name of the FUSE connection of a filesystem on device dev in the FUSE control
// filesystem: the kernel's dev_t (major << 20 | minor) in decimal.
func connName(dev uint64) string {
	return strconv.FormatUint(uint64(unix.Major(dev))<<20|uint64(unix.Minor(dev)), 10)
}

// Close unmounts (lazily if a process still holds a file open, so the mount point is free at
// once), ends the FUSE connection and releases the scratch files. The scratch directory is left
// to the caller, and so is any copy of the connection handed out (Conn).
//
// Unmounting alone may not end the connection: a mount namespace made while the filesystem was
// mounted (a container, another test's node) holds a copy of the mount, and the server would
// wait for it forever. So the connection is aborted through the FUSE control filesystem; reads
// through such copies, or through a detached mount, get ENOTCONN from then on.
func (mt *Mount) Close() error {
	mt.cancel()
	if err := unix.Unmount(mt.Dir, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		if derr := unix.Unmount(mt.Dir, unix.MNT_DETACH); derr != nil && !errors.Is(derr, unix.EINVAL) {
			return fmt.Errorf("unmounting %s: %w (lazy: %v)", mt.Dir, err, derr)
		}
	}
	if err := AbortConn(mt.conn); err != nil {
		// The server ends when the last copy of the mount goes; its files are closed then.
		klog.Background().Error(err, "cannot abort the FUSE connection of a streaming volume; it ends with its last mount", "dir", mt.Dir)
		go mt.release()
		return nil
	}
	mt.release()
	return nil
}

// ConnOf names the FUSE connection of the filesystem mounted at dir (for AbortConn).
func ConnOf(dir string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return "", err
	}
	return connName(st.Dev), nil
}

// fuseCtl is where the FUSE control filesystem is usually mounted.
const fuseCtl = "/sys/fs/fuse/connections"

// AbortConn aborts FUSE connection conn through the control filesystem: the one at fuseCtl, or
// else one mounted for the purpose in a private temporary directory. A connection already gone
// is not an error.
func AbortConn(conn string) error {
	dir := fuseCtl
	if _, err := os.Stat(filepath.Join(dir, conn)); err != nil {
		tmp, err := os.MkdirTemp("", "cistern-fusectl-")
		if err != nil {
			return err
		}
		defer os.Remove(tmp)
		if err := unix.Mount("fusectl", tmp, "fusectl", 0, ""); err != nil {
			return fmt.Errorf("mounting the FUSE control filesystem: %w", err)
		}
		defer unix.Unmount(tmp, unix.MNT_DETACH)
		dir = tmp
	}
	err := os.WriteFile(filepath.Join(dir, conn, "abort"), []byte("1"), 0o200)
	if errors.Is(err, iofs.ErrNotExist) {
		return nil // ended with the unmount
	}
	return err
}

// release waits for the server to end, then closes the scratch files.
func (mt *Mount) release() {
	mt.server.Wait()
	mt.dev.Close()
	mt.mu.Lock()
	defer mt.mu.Unlock()
	for _, s := range mt.streams {
		s.scratch.close()
	}
	for _, f := range mt.files {
		f.close()
	}
	// The kernel dropped the connection's backing files with it.
	for _, b := range mt.backings {
		b.end()
	}
	mt.streams, mt.files, mt.backings = nil, nil, nil
	mt.opens.close()
	if mt.scratch != nil {
		mt.scratch.Close()
	}
}
