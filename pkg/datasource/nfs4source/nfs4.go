//go:build cgo && libnfs

package nfs4source

import (
	"context"
	"io"
	"path"
	"strconv"
	"sync"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// Supported says whether this build reads NFSv4 (cgo and -tags libnfs).
const Supported = true

// idleMax is how long after its lease was last renewed a connection is used again. libnfs 4.0
// sends no RENEW: only OPEN, READ and CLOSE renew the lease, and one that lapses (60 s on
// nfs-ganesha, 90 s on most servers) takes the client ID and its opens with it. A connection
// that only listed, or sat idle, for longer is closed instead.
const idleMax = 30 * time.Second

// readChunk is the most one READ asks for; servers answer 1 MiB at most and fewer bytes are no
// error.
const readChunk = 1 << 20

// Source is an NFSv4 dataset: a directory in the server's namespace. Each concurrent reader has
// a connection of its own (libnfs contexts are single-threaded); idle ones are kept for the next.
type Source struct {
	cfg   Config
	where string

	mu   sync.Mutex
	idle []*conn
}

// New connects to cfg.Host as cfg.UID/GID and checks that cfg.Path is a directory there.
func New(cfg Config) (source.Source, error) {
	if cfg.MaxIdle <= 0 {
		cfg.MaxIdle = 8
	}
	s := &Source{cfg: cfg, where: "nfs://" + cfg.Host + cfg.Path + " (NFSv4)"}
	c, err := s.get()
	if err != nil {
		return nil, err
	}
	defer s.put(c)
	st, err := c.lstat("/")
	if err != nil {
		return nil, classify(err, "reading %s", s.where)
	}
	if !st.isDir() {
		return nil, source.Errorf(source.Invalid, "%s is not a directory", s.where)
	}
	return s, nil
}

// get returns an idle connection, or a new one.
func (s *Source) get() (*conn, error) {
	s.mu.Lock()
	for len(s.idle) > 0 {
		c := s.idle[len(s.idle)-1]
		s.idle = s.idle[:len(s.idle)-1]
		if time.Since(c.renewed) < idleMax {
			s.mu.Unlock()
			return c, nil
		}
		c.close()
	}
	s.mu.Unlock()
	c, err := dial(s.cfg.Host, s.cfg.Path, s.cfg.UID, s.cfg.GID)
	if err != nil {
		return nil, classify(err, "connecting to %s", s.where)
	}
	return c, nil
}

// put keeps c for later, or closes it when enough are kept.
func (s *Source) put(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.idle) >= s.cfg.MaxIdle {
		c.close()
		return
	}
	s.idle = append(s.idle, c)
}

// drop closes a connection a failed call may have left in an unknown state.
func (s *Source) drop(c *conn) { c.close() }

// List walks the tree without following symlinks. Entries' attributes come from an LSTAT of
// each (libnfs gives a directory entry no file ID); a directory is listed only if it is one
// before and after, with the same file ID, so that a directory swapped for a symlink while
// listing is refused rather than followed (libnfs follows symlinks inside paths).
func (s *Source) List(ctx context.Context, fn func(source.Object) error) error {
	c, err := s.get()
	if err != nil {
		return err
	}
	root, err := c.lstat("/")
	if err != nil {
		s.drop(c)
		return classify(err, "reading %s", s.where)
	}
	if err := s.walk(ctx, c, "", root, fn); err != nil {
		s.drop(c)
		return err
	}
	s.put(c)
	return nil
}

func (s *Source) walk(ctx context.Context, c *conn, rel string, dir stat, fn func(source.Object) error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	ents, err := c.readDir("/" + rel)
	if err != nil {
		return classify(err, "listing %s/%s", s.where, rel)
	}
	if now, err := c.lstat("/" + rel); err != nil || !now.isDir() || now.ino != dir.ino || now.dev != dir.dev {
		return source.Errorf(source.Changed, "%s/%s changed while it was listed", s.where, rel)
	}
	for _, e := range ents {
		key := path.Join(rel, e.name)
		st, err := c.lstat("/" + key)
		if err != nil {
			return classify(err, "reading attributes of %s", key)
		}
		o := source.Object{Key: key, Mode: st.mode & 0o777}
		switch {
		case st.isDir():
			o.Type = source.Dir
			if err := fn(o); err != nil {
				return err
			}
			if err := source.ValidateKey(key); err != nil {
				return err // never descend into a name that could not be written
			}
			if err := s.walk(ctx, c, key, st, fn); err != nil {
				return err
			}
			continue
		case st.isReg():
			o.Type, o.Size, o.Version = source.File, int64(st.size), version(st)
		case st.isLink():
			t, err := c.readlink("/" + key)
			if err != nil {
				return classify(err, "reading link %s", key)
			}
			// libnfs 4.0 hands NFSv4 link text on without its end (fixed in later releases):
			// the link's size, its text's length on every server seen, says where it ends.
			if st.size == 0 || st.size > uint64(len(t)) {
				return source.Errorf(source.Invalid, "link %s: its size (%d) does not bound its target %q", key, st.size, t)
			}
			o.Type, o.Target = source.Symlink, t[:st.size]
		default:
			continue // devices, sockets and pipes are not data
		}
		if err := fn(o); err != nil {
			return err
		}
	}
	return nil
}

// version is the file's change token: modification time, size and file ID, so that a read that
// reaches another file (a path swapped meanwhile) is told apart even with the same time and size.
func version(st stat) string {
	mtime := int64(st.mtime)*int64(time.Second) + int64(st.mtimeNsec)
	return strconv.FormatInt(mtime, 36) + "." + strconv.FormatUint(st.size, 36) + "." + strconv.FormatUint(st.ino, 36)
}

// Open reads a byte range of a file: the file listed, or a Changed error.
func (s *Source) Open(_ context.Context, obj source.Object, off, n int64) (io.ReadCloser, error) {
	c, err := s.get()
	if err != nil {
		return nil, err
	}
	f, err := c.open("/" + obj.Key)
	if err != nil {
		err = classify(err, "opening %s", obj.Key)
		if source.KindOf(err) == source.Retryable {
			s.drop(c) // the server did not answer, or the client ID is gone: not for reuse
		} else {
			s.put(c) // a refused open leaves the connection as it was
		}
		return nil, err
	}
	st, err := f.stat()
	if err != nil || !st.isReg() || version(st) != obj.Version {
		_ = f.close()
		s.put(c)
		if err != nil {
			return nil, classify(err, "reading attributes of %s", obj.Key)
		}
		return nil, source.Errorf(source.Changed, "%s changed since the dataset was listed", obj.Key)
	}
	return &reader{s: s, f: f, key: obj.Key, off: off, left: n}, nil
}

type reader struct {
	s         *Source
	f         *file
	key       string
	off, left int64
	failed    bool
}

func (r *reader) Read(p []byte) (int, error) {
	if r.left <= 0 {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	p = p[:min(int64(len(p)), r.left, readChunk)]
	n, err := r.f.pread(p, r.off)
	if err != nil {
		r.failed = true
		return 0, classify(err, "reading %s", r.key)
	}
	if n == 0 {
		return 0, source.Errorf(source.Changed, "%s is shorter than listed", r.key)
	}
	r.off += int64(n)
	r.left -= int64(n)
	return n, nil
}

// Close closes the file and gives the connection back, or drops it after a failed read.
func (r *reader) Close() error {
	if r.f == nil {
		return nil
	}
	err := r.f.close()
	if err != nil || r.failed {
		r.s.drop(r.f.c)
	} else {
		r.s.put(r.f.c)
	}
	r.f = nil
	if err != nil {
		return classify(err, "closing %s", r.key)
	}
	return nil
}

// Verify checks the file did not change while it was copied.
func (s *Source) Verify(_ context.Context, obj source.Object) error {
	c, err := s.get()
	if err != nil {
		return err
	}
	st, err := c.lstat("/" + obj.Key)
	s.put(c)
	if err != nil && source.KindOf(classify(err, "")) != source.NotFound {
		return classify(err, "checking %s", obj.Key)
	}
	if err != nil || !st.isReg() || version(st) != obj.Version {
		return source.Errorf(source.Changed, "%s changed since the dataset was listed", obj.Key)
	}
	return nil
}

// Close closes the idle connections; readers still open close theirs when they are closed.
func (s *Source) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.idle {
		c.close()
	}
	s.idle = nil
	return nil
}
