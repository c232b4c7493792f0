// Package streamfs serves a dataset read-only through FUSE before the node holds all of it:
// every entry of the manifest is visible at once; a read of bytes the node cache already holds is
// served from there (by the kernel itself, FUSE passthrough, for files fully cached); a read of
// missing bytes fetches the parts it touches, checks them against the checksums the source gives,
// and only then hands them out. A part that fails its check is an EIO, never data.
package streamfs

import (
	"context"
	"os"
	"path"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// Config is one dataset served by one mount.
type Config struct {
	// Objects is the dataset's manifest, as listed (and proved readable by the caller).
	Objects []source.Object
	// Cached opens the verified file of obj if the cache holds all of it, or returns nil.
	Cached func(obj source.Object) (*os.File, error)
	// Scratch is a directory for the bytes fetched on demand: one sparse file per entry, named
	// by its manifest line. It must be private to this mount.
	Scratch string
	// Fetcher is where missing bytes come from.
	Fetcher Fetcher
	// FetchTimeout bounds one on-demand fetch (default 10 minutes: a whole large object).
	FetchTimeout time.Duration
	// Room, when set, is asked for room for n bytes before each fetch: an error refuses the read
	// (EIO) rather than filling the pool its volumes share.
	Room func(ctx context.Context, n int64) error
	// OnFetch, when set, is told of every on-demand fetch and its outcome (metrics, tests).
	OnFetch func(key string, off, n int64, err error)
}

// fileMode is what the staging engine gives a file: always readable by any pod user.
func fileMode(o source.Object) uint32 {
	if o.Mode&0o777 == 0 {
		return 0o644
	}
	return o.Mode&0o777 | 0o444
}

func dirMode(o source.Object) uint32 {
	if o.Mode&0o777 == 0 {
		return 0o755
	}
	return o.Mode&0o777 | 0o555
}

// root is the dataset's top directory; OnAdd builds the whole tree from the manifest.
type root struct {
	dirNode
	m *mount
}

var _ = (fs.NodeOnAdder)((*root)(nil))

func (r *root) OnAdd(ctx context.Context) {
	dirs := map[string]*fs.Inode{".": &r.Inode}
	// A name listed twice (a file and a directory "a", say) keeps its first entry; staging
	// refuses such a dataset.
	add := func(parent *fs.Inode, key string, in *fs.Inode) {
		if !parent.AddChild(path.Base(key), in, false) {
			klog.FromContext(ctx).Info("streaming volume: entry conflicts with another, not shown", "key", key)
		}
	}
	var dir func(p string) *fs.Inode
	dir = func(p string) *fs.Inode {
		if in, ok := dirs[p]; ok {
			return in
		}
		parent := dir(path.Dir(p))
		in := parent.NewPersistentInode(ctx, &dirNode{mode: 0o755}, fs.StableAttr{Mode: fuse.S_IFDIR})
		add(parent, p, in)
		dirs[p] = in
		return in
	}
	for i, o := range r.m.cfg.Objects {
		parent := dir(path.Dir(o.Key))
		switch o.Type {
		case source.Dir:
			d := dir(o.Key)
			d.Operations().(*dirNode).mode = dirMode(o)
		case source.Symlink:
			in := parent.NewPersistentInode(ctx, &fs.MemSymlink{Data: []byte(o.Target)}, fs.StableAttr{Mode: fuse.S_IFLNK})
			add(parent, o.Key, in)
		default:
			f := &fileNode{obj: o, line: int64(i), m: r.m}
			in := parent.NewPersistentInode(ctx, f, fs.StableAttr{Mode: fuse.S_IFREG})
			add(parent, o.Key, in)
		}
	}
}

// dirNode is a directory of the manifest.
type dirNode struct {
	fs.Inode
	mode uint32
}

var _ = (fs.NodeGetattrer)((*dirNode)(nil))

func (d *dirNode) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = fuse.S_IFDIR | d.mode
	out.Nlink = 2
	return 0
}
