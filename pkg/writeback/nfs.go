package writeback

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	nfs "github.com/willscott/go-nfs-client/nfs"
	"github.com/willscott/go-nfs-client/nfs/rpc"

	"github.com/cistern-csi/cistern/pkg/datasource/nfssource"
)

// An NFS target (nfs://server[:port]/export/path) receives a volume's outputs as files, through a
// userspace NFSv3 client (go-nfs-client), as the node's NFS identity (Config.NFSUID/NFSGID): the
// server's export rules and file permissions decide what it may write. Each file is written
// whole to a temporary name beside its own (FILE_SYNC writes, then COMMIT), read back and
// compared by CRC-32C (NFSv3 has no checksum the server verifies), and renamed into place:
// a reader never sees a partial file, and the journal records it done only after the rename.
// A crash leaves at most the temporary file, which the next pass writes again from its start.

// nfsDest is an NFS target mounted for one pass. Requests go one at a time: the client's
// connection is not shared between concurrent calls.
type nfsDest struct {
	mu     sync.Mutex
	mount  *nfs.Mount
	target *nfs.Target
	base   string // the target's directory inside the mounted export
	// uid and gid are the AUTH_SYS identity requests carry, named in refusals.
	uid, gid uint32
}

// partPrefix names the temporary file a file is written to before its rename.
const partPrefix = ".cistern-part-"

// dialNFS mounts t's export as uid/gid: its path as given when the server allows, else its
// longest mountable prefix (servers refuse to mount below an export), the rest looked up. A
// target confined to a namespace (Target.Namespace) mounts its shortest mountable prefix
// instead, the export itself, and is written below the export's <Namespace>/ directory: a
// tenant naming a path inside another namespace's directory cannot make that directory the
// export by mounting it directly (knfsd and nfs-ganesha mount any directory of an export).
func dialNFS(t Target, uid, gid uint32) (*nfsDest, error) {
	auth := rpc.NewAuthUnix("cistern", uid, gid).Auth()
	d := &nfsDest{uid: uid, gid: gid}
	var err error
	if _, _, perr := net.SplitHostPort(t.Host); perr == nil {
		var c *rpc.Client
		if c, err = nfssource.RetryAddrInUse(func() (*rpc.Client, error) { return rpc.DialTCP("tcp", t.Host, false) }); err == nil {
			d.mount = &nfs.Mount{Client: c}
		}
	} else {
		d.mount, err = nfssource.RetryAddrInUse(func() (*nfs.Mount, error) { return nfs.DialMount(t.Host, time.Minute) })
	}
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", t, err)
	}
	segs := strings.Split(strings.TrimSuffix(t.Prefix, "/"), "/")
	// Longest first: n segments make the export, the rest is looked up below it.
	n, step, stop := len(segs), -1, -1
	if t.Namespace != "" {
		n, step, stop = 1, 1, len(segs)+1
	}
	for ; n != stop; n += step {
		// Through the portmapper, Mount dials the NFS service too.
		d.target, err = nfssource.RetryAddrInUse(func() (*nfs.Target, error) { return d.mount.Mount("/"+path.Join(segs[:n]...), auth) })
		if err == nil || !strings.HasPrefix(err.Error(), "MNT3ERR_") {
			break
		}
	}
	if err != nil {
		d.mount.Close()
		return nil, d.explain(err, "mounting", t.String())
	}
	d.base = path.Join(append([]string{t.Namespace}, segs[n:]...)...)
	return d, nil
}

func (d *nfsDest) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.target.Close()
	d.mount.Close()
}

// full is a volume path's path inside the mounted export.
func (d *nfsDest) full(p string) string { return path.Join(d.base, p) }

// put writes n bytes of fh at p, as described above, and returns their CRC-32C. A file
// for which stable says false just before the rename (a checkpoint's file written meanwhile) is
// not renamed into place: its temporary file is removed.
func (d *nfsDest) put(ctx context.Context, fh *os.File, n int64, p string, stable func() bool) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	final := d.full(p)
	if err := d.mkdirAll(path.Dir(final)); err != nil {
		return "", err
	}
	part := path.Join(path.Dir(final), partPrefix+path.Base(final))
	if err := d.target.Remove(part); err != nil && !notExist(err) {
		return "", d.explain(err, "removing", part)
	}
	f, err := d.target.OpenFile(part, 0o644)
	if err != nil {
		return "", d.explain(err, "creating", part)
	}
	h := algCRC32C.hash()
	_, err = io.Copy(f, io.TeeReader(io.NewSectionReader(fh, 0, n), &ctxWriter{ctx: ctx, w: h}))
	if cerr := f.Close(); err == nil {
		err = cerr // COMMIT: the bytes are on the server's stable storage
	}
	if err != nil {
		return "", d.explain(err, "writing", part)
	}
	sum := sumString(h)
	if err := d.verify(part, n, sum); err != nil {
		return "", err
	}
	if !stable() {
		_ = d.target.Remove(part)
		return "", errors.New("written while it was sent")
	}
	if err := d.target.Rename(part, final); err != nil {
		return "", d.explain(err, "renaming into place", final)
	}
	return sum, nil
}

// verify reads back what the server holds at p: n bytes whose CRC-32C is sum.
func (d *nfsDest) verify(p string, n int64, sum string) error {
	f, err := d.target.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	h := algCRC32C.hash()
	got, err := io.Copy(h, f)
	if err != nil {
		return err
	}
	if have := sumString(h); got != n || have != sum {
		return fmt.Errorf("%s: the server holds %d bytes with CRC-32C %s, not the %d sent (%s)", p, got, have, n, sum)
	}
	return nil
}

// mkdirAll makes dir and its parents inside the export.
func (d *nfsDest) mkdirAll(dir string) error {
	if dir == "." || dir == "/" || dir == "" {
		return nil
	}
	if fi, _, err := d.target.Lookup(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	if err := d.mkdirAll(path.Dir(dir)); err != nil {
		return err
	}
	if _, err := d.target.Mkdir(dir, 0o755); err != nil && !exists(err) {
		return d.explain(err, "making directory", dir)
	}
	return nil
}

// remove deletes p; without the lower directory to tell, a directory with all below it.
func (d *nfsDest) remove(p string, all bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	full := d.full(p)
	fi, _, err := d.target.Lookup(full)
	switch {
	case notExist(err):
		return nil
	case err != nil:
		return err
	case fi.IsDir() && all:
		return d.explain(d.target.RemoveAll(full), "removing", full)
	case fi.IsDir():
		return nil // a dataset directory is not a file: its files are deleted one by one
	}
	if err := d.target.Remove(full); err != nil && !notExist(err) {
		return d.explain(err, "removing", full)
	}
	return nil
}

// explain says what the server refused, where (a path inside the export) and, for a refusal, to
// whom: NFS3ERR_ACCES alone names none of them.
func (d *nfsDest) explain(err error, op, p string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrPermission), strings.Contains(err.Error(), "ACCES"), strings.Contains(err.Error(), "PERM"):
		return fmt.Errorf("%s %s: access denied to AUTH_SYS uid %d gid %d: %w", op, p, d.uid, d.gid, err)
	}
	return fmt.Errorf("%s %s: %w", op, p, err)
}

func notExist(err error) bool {
	return err != nil && (errors.Is(err, os.ErrNotExist) || strings.Contains(err.Error(), "NOENT"))
}

func exists(err error) bool {
	return errors.Is(err, os.ErrExist) || strings.Contains(err.Error(), "EXIST")
}

// ctxWriter stops a copy once ctx ends.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c *ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

// ProbeNFS checks, before a volume's pod starts, that t may be written as uid/gid: it makes the
// target directory as needed, creates the file name in it and removes it.
func ProbeNFS(t Target, uid, gid uint32, name string) error {
	d, err := dialNFS(t, uid, gid)
	if err != nil {
		return err
	}
	defer d.close()
	if err := d.mkdirAll(d.full(".")); err != nil {
		return err
	}
	p := d.full(name)
	if _, err := d.target.Create(p, 0o644); err != nil && !exists(err) {
		return d.explain(err, "creating", p)
	}
	return d.explain(d.target.Remove(p), "removing", p)
}
