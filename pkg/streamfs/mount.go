package streamfs

import (
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Mount is a dataset served at a directory.
type Mount struct {
	Dir    string
	server *fuse.Server
	conn   string // the FUSE connection's name in the control filesystem
	*mount
}

// mount is what the nodes of one mount share.
type mount struct {
	cfg Config
	// ctx ends with the mount: read-ahead fetches stop.
	ctx     context.Context
	cancel  context.CancelFunc
	mu      sync.Mutex
	streams []*stream
	files   []*os.File // cached files reads found in the cache
	// reads counts the reads that reached this process (not those the kernel passed through).
	reads atomic.Int64
}

// Reads is how many reads reached the filesystem's server: a file passed through to the kernel
// adds none.
func (mt *Mount) Reads() int64 { return mt.reads.Load() }

func (m *mount) track(s *stream) {
	m.mu.Lock()
	m.streams = append(m.streams, s)
	m.mu.Unlock()
}

func (m *mount) trackFile(f *os.File) {
	m.mu.Lock()
	m.files = append(m.files, f)
	m.mu.Unlock()
}

// Start mounts the dataset read-only at dir and serves it until Close. The directory entries
// and attributes never change, so the kernel caches them for long.
func Start(dir string, cfg Config) (*Mount, error) {
	if cfg.Fetcher == nil || cfg.Cached == nil || cfg.Scratch == "" {
		return nil, errors.New("streamfs: Fetcher, Cached and Scratch are required")
	}
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = 10 * time.Minute
	}
	if err := os.MkdirAll(cfg.Scratch, 0o700); err != nil {
		return nil, err
	}
	m := &mount{cfg: cfg}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	r := &root{dirNode: dirNode{mode: 0o755}, m: m}
	long := time.Hour
	server, err := fs.Mount(dir, r, &fs.Options{
		EntryTimeout: &long, AttrTimeout: &long, NegativeTimeout: &long,
		MountOptions: fuse.MountOptions{
			FsName: "cistern", Name: "cistern-stream", Options: []string{"ro"},
			// Pods run as any user; the node plugin is the only server.
			AllowOther: true, DirectMount: true,
			// Reads of up to 1 MiB per request (the default is 128 KiB): fewer round trips.
			MaxReadAhead: 1 << 20, MaxWrite: 1 << 20, DisableXAttrs: true,
		},
	})
	if err != nil {
		m.cancel()
		return nil, fmt.Errorf("mounting the streaming filesystem at %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		_ = server.Unmount()
		m.cancel()
		return nil, fmt.Errorf("reading the streaming filesystem at %s: %w", dir, err)
	}
	return &Mount{Dir: dir, server: server, mount: m, conn: connName(st.Dev)}, nil
}

// connName is the name of the FUSE connection of a filesystem on device dev in the FUSE control
// filesystem: the kernel's dev_t (major << 20 | minor) in decimal.
func connName(dev uint64) string {
	return strconv.FormatUint(uint64(unix.Major(dev))<<20|uint64(unix.Minor(dev)), 10)
}

// Close unmounts (lazily if a process still holds a file open, so the mount point is free at
// once), ends the FUSE connection and releases the scratch files. The scratch directory is left
// to the caller.
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
	if err := abortConn(mt.conn); err != nil {
		// The server ends when the last copy of the mount goes; its files are closed then.
		klog.Background().Error(err, "cannot abort the FUSE connection of a streaming volume; it ends with its last mount", "dir", mt.Dir)
		go mt.release()
		return nil
	}
	mt.release()
	return nil
}

// fuseCtl is where the FUSE control filesystem is usually mounted.
const fuseCtl = "/sys/fs/fuse/connections"

// abortConn aborts FUSE connection conn through the control filesystem: the one at fuseCtl, or
// else one mounted for the purpose in a private temporary directory. A connection already gone
// is not an error.
func abortConn(conn string) error {
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
	mt.mu.Lock()
	defer mt.mu.Unlock()
	for _, s := range mt.streams {
		s.file.Close()
	}
	for _, f := range mt.files {
		f.Close()
	}
	mt.streams, mt.files = nil, nil
}
