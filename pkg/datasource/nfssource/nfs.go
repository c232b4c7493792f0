// Package nfssource reads datasets from NFSv3 servers with a userspace client
// (github.com/willscott/go-nfs-client), so nodes need no kernel NFS client and no mount.
package nfssource

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"strconv"
	"strings"
	"syscall"
	"time"

	nfs "github.com/willscott/go-nfs-client/nfs"
	"github.com/willscott/go-nfs-client/nfs/rpc"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// Source is an NFS dataset: a directory inside an export.
type Source struct {
	where  string
	mount  *nfs.Mount
	target *nfs.Target
	base   string // directory inside the mounted export, "" for its root
	// uid and gid are the AUTH_UNIX identity requests carry, named in refusals.
	uid, gid uint32
}

// New mounts dir on host. host is "server" (MOUNT and NFS ports from the portmapper) or
// "server:port" (one port serving both protocols, as userspace servers do). dir is mounted as
// given when the server allows it (Linux knfsd allows subdirectories of an export); otherwise its
// longest mountable prefix is mounted and the rest looked up. Requests carry AUTH_UNIX uid and
// gid: the server's export rules and file permissions apply to that identity.
func New(host, dir string, uid, gid uint32) (*Source, error) {
	s := &Source{where: "nfs://" + host + dir, uid: uid, gid: gid}
	auth := rpc.NewAuthUnix("cistern", uid, gid).Auth()
	var err error
	if _, _, perr := net.SplitHostPort(host); perr == nil {
		var c *rpc.Client
		c, err = RetryAddrInUse(func() (*rpc.Client, error) { return rpc.DialTCP("tcp", host, false) })
		if err == nil {
			s.mount = &nfs.Mount{Client: c}
		}
	} else {
		s.mount, err = RetryAddrInUse(func() (*nfs.Mount, error) { return nfs.DialMount(host, time.Minute) })
	}
	if err != nil {
		return nil, s.classify(err, "connecting to %s", s.where)
	}
	export, rest := dir, ""
	for {
		// Through the portmapper, Mount dials the NFS service too.
		s.target, err = RetryAddrInUse(func() (*nfs.Target, error) { return s.mount.Mount(export, auth) })
		if err == nil || export == "/" || !mountRefused(err) {
			break
		}
		rest = path.Join(path.Base(export), rest)
		export = path.Dir(export)
	}
	if err != nil {
		s.mount.Close()
		return nil, s.classify(err, "mounting %s", s.where)
	}
	s.base = rest
	if rest != "" {
		if fi, _, err := s.target.Lookup(rest); err != nil {
			s.Close()
			return nil, s.classify(err, "looking up %s", s.where)
		} else if !fi.IsDir() {
			s.Close()
			return nil, source.Errorf(source.Invalid, "%s is not a directory", s.where)
		}
	}
	return s, nil
}

// RetryAddrInUse calls dial again, a few times, while it fails with EADDRINUSE: the client
// library binds each connection to a random local port in 49152-65535 and, unless privileged,
// tries no other when that one is taken.
func RetryAddrInUse[T any](dial func() (T, error)) (T, error) {
	v, err := dial()
	for try := 1; try < 8 && errors.Is(err, syscall.EADDRINUSE); try++ {
		v, err = dial()
	}
	return v, err
}

func mountRefused(err error) bool {
	m := err.Error()
	return m == "MNT3ERR_NOENT" || m == "MNT3ERR_ACCES" || m == "MNT3ERR_PERM"
}

func (s *Source) full(key string) string { return path.Join(s.base, key) }

// List walks the directory tree with READDIRPLUS.
func (s *Source) List(ctx context.Context, fn func(source.Object) error) error {
	return s.walk(ctx, "", fn)
}

func (s *Source) walk(ctx context.Context, rel string, fn func(source.Object) error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	dir := s.base
	if rel != "" {
		dir = s.full(rel)
	}
	ents, err := s.target.ReadDirPlus(dir)
	if err != nil {
		return s.classify(err, "listing %s/%s", s.where, rel)
	}
	for _, e := range ents {
		key := e.FileName
		if rel != "" {
			key = rel + "/" + e.FileName
		}
		if !e.Attr.IsSet {
			fi, _, err := s.target.Lookup(s.full(key))
			if err != nil {
				return s.classify(err, "reading attributes of %s", key)
			}
			e.Attr.Attr = *fi.(*nfs.Fattr)
		}
		a := e.Attr.Attr
		o := source.Object{Key: key, Mode: a.FileMode & 0o777}
		switch a.Type {
		case nfs.NF3Dir:
			o.Type = source.Dir
			if err := fn(o); err != nil {
				return err
			}
			if err := source.ValidateKey(key); err != nil {
				return err // never descend into a name that could not be written
			}
			if err := s.walk(ctx, key, fn); err != nil {
				return err
			}
			continue
		case nfs.NF3Reg:
			o.Type, o.Size, o.Version = source.File, int64(a.Filesize), version(&a)
		case nfs.NF3Lnk:
			f, err := s.target.Open(s.full(key))
			if err != nil {
				return s.classify(err, "opening link %s", key)
			}
			t, err := f.Readlink()
			if err != nil {
				return s.classify(err, "reading link %s", key)
			}
			o.Type, o.Target = source.Symlink, t
		default:
			continue
		}
		if err := fn(o); err != nil {
			return err
		}
	}
	return nil
}

func version(a *nfs.Fattr) string {
	return strconv.FormatInt(a.ModTime().UnixNano(), 36) + "." + strconv.FormatUint(a.Filesize, 36)
}

// Open reads a byte range of a file.
func (s *Source) Open(_ context.Context, obj source.Object, off, n int64) (io.ReadCloser, error) {
	f, err := s.target.Open(s.full(obj.Key))
	if err != nil {
		return nil, s.classify(err, "opening %s", obj.Key)
	}
	return io.NopCloser(&reader{r: io.NewSectionReader(f, off, n), key: obj.Key, s: s}), nil
}

type reader struct {
	r   io.Reader
	key string
	s   *Source
}

func (r *reader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		err = r.s.classify(err, "reading %s", r.key)
	}
	return n, err
}

// CheckRead asks the server (ACCESS, no data read) whether the node's identity may read obj as
// listed: read rights differ from file to file (owner, group, mode), so an access proof checks
// each file rather than a sample (source.ReadChecker).
func (s *Source) CheckRead(_ context.Context, obj source.Object) error {
	if err := s.Verify(context.Background(), obj); err != nil {
		return err
	}
	granted, err := s.target.Access(s.full(obj.Key), nfs.ACCESS3_READ)
	if err != nil {
		return s.classify(err, "checking read access to %s", obj.Key)
	}
	if granted&nfs.ACCESS3_READ == 0 {
		return source.Errorf(source.Denied, "reading %s: access denied to AUTH_UNIX uid %d gid %d", obj.Key, s.uid, s.gid)
	}
	return nil
}

// Verify checks the file did not change while it was copied.
func (s *Source) Verify(_ context.Context, obj source.Object) error {
	fi, _, err := s.target.Lookup(s.full(obj.Key))
	if err != nil {
		return s.classify(err, "checking %s", obj.Key)
	}
	if a, ok := fi.(*nfs.Fattr); !ok || version(a) != obj.Version {
		return source.Errorf(source.Changed, "%s changed since the dataset was listed", obj.Key)
	}
	return nil
}

// Close unmounts and closes connections.
func (s *Source) Close() error {
	if s.target != nil && (s.mount == nil || s.target.Client != s.mount.Client) {
		s.target.Close()
	}
	if s.mount != nil {
		s.mount.Close()
	}
	return nil
}

// classify is the package's classify, naming the identity in a refusal: the server's export
// rules and file permissions judged that uid and gid (--nfs-uid, --nfs-gid).
func (s *Source) classify(err error, format string, args ...any) error {
	err = classify(err, format, args...)
	if e := (*source.Error)(nil); errors.As(err, &e) && e.Kind == source.Denied {
		e.Msg += fmt.Sprintf(" to AUTH_UNIX uid %d gid %d", s.uid, s.gid)
	}
	return err
}

func classify(err error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	var ne *net.OpError
	var dns *net.DNSError
	switch {
	case errors.As(err, &dns) && dns.IsNotFound:
		return source.Wrap(source.Invalid, err, "%s: bad server", msg)
	case errors.Is(err, os.ErrNotExist), strings.Contains(err.Error(), "NOENT"):
		return source.Wrap(source.NotFound, err, "%s: not found", msg)
	case errors.Is(err, os.ErrPermission), strings.Contains(err.Error(), "ACCES"), strings.Contains(err.Error(), "PERM"):
		return source.Wrap(source.Denied, err, "%s: access denied", msg)
	case errors.As(err, &ne):
		return source.Wrap(source.Retryable, err, "%s", msg)
	}
	return source.Wrap(source.Retryable, err, "%s", msg)
}
