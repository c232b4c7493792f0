// Package streamfs serves a dataset read-only through FUSE before the node holds all of it:
// every entry of the manifest is visible at once; a read of bytes the node cache already holds is
// served from there (by the kernel itself, FUSE passthrough, for files fully cached); a read of
// missing bytes fetches the parts it touches, checks them against the checksums the source gives,
// and only then hands them out. A part that fails its check is an EIO, never data.
//
// The filesystem answers the kernel at the level of node IDs and handles (go-fuse's raw API)
// and keeps no per-request state the kernel depends on: node IDs follow from the manifest, and
// handles name no table. So another process can take over the connection of a mount whose
// server died (Conn, Resume) and answer what the kernel already holds.
package streamfs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path"
	"syscall"
	"time"

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
	// by its manifest line. It must be private to this mount, and outlive a process serving it
	// that is to be taken over (Resume). The mount opens it once and holds it: moved or renamed
	// later, it is still where the mount's bytes go.
	Scratch string
	// Fetcher is where missing bytes come from.
	Fetcher Fetcher
	// Join, when set, is asked first by a read of a file Cached does not hold yet, that no read
	// fetched, and that is checked as a whole (or small: see joins): it waits for the background
	// staging to commit the file (line i of the manifest) to the cache, having asked it to fetch
	// it next, and reports whether it did. The read is then served from Cached, and the file
	// downloaded once, not once by the staging and again here. False: the read fetches the file
	// itself (Fetcher).
	Join func(ctx context.Context, i int64, obj source.Object) bool
	// FetchTimeout bounds one on-demand fetch (default 10 minutes: a whole large object).
	FetchTimeout time.Duration
	// Room, when set, is asked for room for n bytes before each fetch: an error refuses the read
	// (EIO) rather than filling the pool its volumes share.
	Room func(ctx context.Context, n int64) error
	// Files bounds the descriptors the mount's files hold (the cache's copies, the scratch
	// files): one for every mount of the node plugin. Nil: a bound of DefaultMaxOpenFiles for
	// this mount alone.
	Files *OpenFiles
	// OnFetch, when set, is told of every on-demand fetch and its outcome (metrics, tests).
	OnFetch func(key string, off, n int64, err error)
	// Unverifiable, when set, decides what becomes of an object nothing can check (err says
	// why): nil serves it, an error refuses its reads (EIO). Nil refuses every such object.
	Unverifiable func(ctx context.Context, obj source.Object, err error) error
	// refused, when set, is why the mount serves nothing (Refuse).
	refused string
}

// manifestID names a manifest: a process serves a mount taken over only if its manifest is the
// one the node IDs the kernel holds were derived from.
func manifestID(objs []source.Object) string {
	b, _ := json.Marshal(objs)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
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

// node is an entry of the tree. Its FUSE node ID is its index in tree.nodes plus one: the root
// is 1, the others follow in the order the manifest names them.
type node struct {
	name   string
	mode   uint32 // type and permission bits
	target string // symlinks
	kids   []uint64
	byName map[string]uint64 // directories
	file   *fileNode         // regular files
}

type tree struct{ nodes []*node }

// get returns node id, or nil for an ID this tree never gave out.
func (t *tree) get(id uint64) *node {
	if id == 0 || id > uint64(len(t.nodes)) {
		return nil
	}
	return t.nodes[id-1]
}

// buildTree lays the manifest out as directories; the same manifest always gives the same IDs.
// A name listed twice (a file and a directory "a", say) keeps its first entry; staging refuses
// such a dataset.
func buildTree(ctx context.Context, m *mount) *tree {
	t := &tree{nodes: []*node{{mode: fuse.S_IFDIR | 0o755, byName: map[string]uint64{}}}}
	// add appends n; it is linked into parent unless the name is taken (a hidden node still
	// has an ID, so that the IDs never depend on which entry won).
	add := func(parent uint64, key string, n *node) uint64 {
		n.name = path.Base(key)
		t.nodes = append(t.nodes, n)
		id := uint64(len(t.nodes))
		p := t.get(parent)
		if _, taken := p.byName[n.name]; taken {
			klog.FromContext(ctx).Info("streaming volume: entry conflicts with another, not shown", "key", key)
			return id
		}
		p.byName[n.name] = id
		p.kids = append(p.kids, id)
		return id
	}
	dirs := map[string]uint64{".": 1}
	var dir func(p string) uint64
	dir = func(p string) uint64 {
		if id, ok := dirs[p]; ok {
			return id
		}
		id := add(dir(path.Dir(p)), p, &node{mode: fuse.S_IFDIR | 0o755, byName: map[string]uint64{}})
		dirs[p] = id
		return id
	}
	for i, o := range m.cfg.Objects {
		switch o.Type {
		case source.Dir:
			t.get(dir(path.Clean(o.Key))).mode = fuse.S_IFDIR | dirMode(o)
		case source.Symlink:
			add(dir(path.Dir(o.Key)), o.Key, &node{mode: fuse.S_IFLNK | 0o777, target: o.Target})
		default:
			add(dir(path.Dir(o.Key)), o.Key, &node{mode: fuse.S_IFREG | fileMode(o),
				file: &fileNode{obj: o, line: int64(i), m: m}})
		}
	}
	return t
}

// long is how long the kernel may keep entries and attributes: they never change.
const long = time.Hour

func (n *node) attr(id uint64, a *fuse.Attr) {
	a.Ino, a.Mode, a.Nlink = id, n.mode, 1
	switch {
	case n.file != nil:
		a.Size = uint64(n.file.obj.Size)
		a.Blocks = (a.Size + 511) / 512
	case n.byName != nil:
		a.Nlink = 2
	default:
		a.Size = uint64(len(n.target))
	}
}

// rawFS answers the kernel for one mount.
type rawFS struct {
	fuse.RawFileSystem // ENOSYS for what a read-only tree does not do
	m                  *mount
	t                  *tree
	srv                *fuse.Server
	// epoch is this process's mark on the handles it gives out, so that a handle a taken-over
	// connection still carries from an earlier process is told apart (see fileNode.open).
	epoch uint64
}

var errStale = fuse.Status(syscall.ESTALE)

func (f *rawFS) String() string { return Subtype }

func (f *rawFS) Init(s *fuse.Server) { f.srv = s }

func (f *rawFS) entry(id uint64, out *fuse.EntryOut) {
	out.NodeId, out.Generation = id, 1
	f.t.get(id).attr(id, &out.Attr)
	out.SetEntryTimeout(long)
	out.SetAttrTimeout(long)
}

// refused: the mount serves nothing (Refuse).
func (f *rawFS) refused() bool { return f.m.cfg.refused != "" }

func (f *rawFS) Lookup(_ <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	p := f.t.get(h.NodeId)
	switch {
	case f.refused():
		return fuse.EIO
	case p == nil:
		return errStale
	case p.byName == nil:
		return fuse.ENOTDIR
	}
	id, ok := p.byName[name]
	if !ok {
		// The kernel may remember the name is missing: the tree never changes.
		out.NodeId = 0
		out.SetEntryTimeout(long)
		return fuse.OK
	}
	f.entry(id, out)
	return fuse.OK
}

// Forget: nodes live as long as the mount.
func (f *rawFS) Forget(uint64, uint64) {}

func (f *rawFS) GetAttr(_ <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	n := f.t.get(in.NodeId)
	switch {
	case f.refused() && in.NodeId != 1: // the root's attributes tell nothing of the data
		return fuse.EIO
	case n == nil:
		return errStale
	}
	n.attr(in.NodeId, &out.Attr)
	out.SetTimeout(long)
	return fuse.OK
}

func (f *rawFS) Readlink(_ <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	n := f.t.get(h.NodeId)
	if f.refused() {
		return nil, fuse.EIO
	}
	if n == nil || n.mode&syscall.S_IFMT != syscall.S_IFLNK {
		return nil, fuse.EINVAL
	}
	return []byte(n.target), fuse.OK
}

func (f *rawFS) OpenDir(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	n := f.t.get(in.NodeId)
	switch {
	case f.refused():
		return fuse.EIO
	case n == nil:
		return errStale
	case n.byName == nil:
		return fuse.ENOTDIR
	}
	out.OpenFlags = fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_CACHE_DIR
	return fuse.OK
}

// ReadDir lists "." and "..", then the children in order; the offset of an entry is its index
// plus one, so a listing needs no handle.
func (f *rawFS) ReadDir(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return f.readDir(in, out, false)
}

func (f *rawFS) ReadDirPlus(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return f.readDir(in, out, true)
}

func (f *rawFS) readDir(in *fuse.ReadIn, out *fuse.DirEntryList, plus bool) fuse.Status {
	n := f.t.get(in.NodeId)
	switch {
	case f.refused():
		return fuse.EIO
	case n == nil || n.byName == nil:
		return errStale
	}
	for i := in.Offset; i < uint64(len(n.kids))+2; i++ {
		e := fuse.DirEntry{Mode: fuse.S_IFDIR, Name: ".", Ino: in.NodeId, Off: i + 1}
		var id uint64
		switch i {
		case 0:
		case 1:
			e.Name = ".."
		default:
			id = n.kids[i-2]
			k := f.t.get(id)
			e.Mode, e.Name, e.Ino = k.mode, k.name, id
		}
		if !plus {
			if !out.AddDirEntry(e) {
				break
			}
			continue
		}
		eo := out.AddDirLookupEntry(e)
		if eo == nil {
			break
		}
		if id != 0 {
			f.entry(id, eo)
		}
	}
	return fuse.OK
}

func (f *rawFS) ReleaseDir(*fuse.ReleaseIn) {}

func (f *rawFS) StatFs(_ <-chan struct{}, _ *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	var size uint64
	for _, o := range f.m.cfg.Objects {
		size += uint64(max(o.Size, 0))
	}
	out.Bsize, out.Frsize, out.NameLen = 4096, 4096, 255
	out.Blocks, out.Files = (size+4095)/4096, uint64(len(f.t.nodes))
	return fuse.OK
}

// Flush: nothing to flush (opens also say so, FOPEN_NOFLUSH); ENOSYS tells the kernel to stop
// asking.
func (f *rawFS) Flush(<-chan struct{}, *fuse.FlushIn) fuse.Status { return fuse.ENOSYS }
