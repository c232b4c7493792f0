package streamfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Mount is a dataset served at a directory.
type Mount struct {
	Dir    string
	server *fuse.Server
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
	return &Mount{Dir: dir, server: server, mount: m}, nil
}

// Close unmounts (lazily if a process still holds a file open, so the mount point is free at
// once) and releases the scratch files. The scratch directory is left to the caller.
func (mt *Mount) Close() error {
	mt.cancel()
	if err := mt.server.Unmount(); err != nil {
		if uerr := syscall.Unmount(mt.Dir, syscall.MNT_DETACH); uerr != nil && !errors.Is(uerr, syscall.EINVAL) {
			return fmt.Errorf("unmounting %s: %w (lazy: %v)", mt.Dir, err, uerr)
		}
		// Detached: the server ends when the last open file is closed.
		go mt.release()
		return nil
	}
	mt.release()
	return nil
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
