// Package localsource reads datasets from a node directory, only under the roots the node admin
// allows (--local-source-roots). Reads go through an os.Root, so a symlink swapped in during
// staging cannot lead outside the source directory.
package localsource

import (
	"context"

	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// Source is a node-local dataset.
type Source struct {
	path string
	root *os.Root
}

// New opens path if, after resolving symlinks, it lies under one of roots.
func New(path string, roots []string) (*Source, error) {
	if len(roots) == 0 {
		return nil, source.Errorf(source.Denied, "file:// sources are disabled on this node (no --local-source-roots)")
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, source.Wrap(source.NotFound, err, "local source %s", path)
		}
		return nil, source.Wrap(source.Invalid, err, "local source %s", path)
	}
	if !under(real, roots) {
		return nil, source.Errorf(source.Denied, "local source %s is not under an allowed root (%s)", path, strings.Join(roots, ", "))
	}
	root, err := os.OpenRoot(real)
	if err != nil {
		return nil, source.Wrap(source.Invalid, err, "local source %s", path)
	}
	return &Source{path: path, root: root}, nil
}

func under(p string, roots []string) bool {
	for _, r := range roots {
		rr, err := filepath.EvalSymlinks(r)
		if err != nil {
			continue
		}
		rel, err := filepath.Rel(rr, p)
		if err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return true
		}
	}
	return false
}

// List walks the tree without following symlinks.
func (s *Source) List(ctx context.Context, fn func(source.Object) error) error {
	return fs.WalkDir(s.root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return source.Wrap(source.Retryable, err, "walking %s", s.path)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if p == "." {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return source.Wrap(source.Retryable, err, "walking %s", s.path)
		}
		o := source.Object{Key: p, Mode: uint32(info.Mode().Perm())}
		switch {
		case d.IsDir():
			o.Type = source.Dir
		case info.Mode().IsRegular():
			o.Type, o.Size, o.Version = source.File, info.Size(), version(info)
		case info.Mode()&fs.ModeSymlink != 0:
			t, err := s.root.Readlink(p)
			if err != nil {
				return source.Wrap(source.Retryable, err, "reading link %s", p)
			}
			o.Type, o.Target = source.Symlink, t
		default:
			return nil // devices, sockets and pipes are not data
		}
		return fn(o)
	})
}

func version(fi fs.FileInfo) string {
	return strconv.FormatInt(fi.ModTime().UnixNano(), 36) + "." + strconv.FormatInt(fi.Size(), 36)
}

// Open reads a byte range of a regular file.
func (s *Source) Open(_ context.Context, obj source.Object, off, n int64) (io.ReadCloser, error) {
	f, err := s.root.Open(obj.Key)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, source.Wrap(source.Changed, err, "%s vanished since the dataset was listed", obj.Key)
		}
		return nil, source.Wrap(source.Retryable, err, "opening %s", obj.Key)
	}
	return &section{Reader: io.NewSectionReader(f, off, n), f: f}, nil
}

type section struct {
	io.Reader
	f *os.File
}

func (s *section) Close() error { return s.f.Close() }

// Verify checks the file did not change while it was copied.
func (s *Source) Verify(_ context.Context, obj source.Object) error {
	fi, err := s.root.Lstat(obj.Key)
	if err != nil || !fi.Mode().IsRegular() || version(fi) != obj.Version {
		return source.Errorf(source.Changed, "%s changed since the dataset was listed", obj.Key)
	}
	return nil
}

// Close releases the directory.
func (s *Source) Close() error { return s.root.Close() }
