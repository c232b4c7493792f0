package cache

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/cistern-csi/cistern/pkg/datasource/dataset"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// populatedXattr marks a volume's root once it holds its dataset, so Populate runs once per volume
// even across NodeStage retries and restarts; trusted.* is invisible to unprivileged pods.
const (
	populatedXattr = "trusted.cistern.dataset"
	populateTmp    = ".cistern-populate"
)

// Populated reports whether the filesystem at target was already filled with spec's dataset.
func Populated(target string, spec *dataset.Spec) bool {
	buf := make([]byte, 64)
	n, err := unix.Getxattr(target, populatedXattr, buf)
	return err == nil && string(buf[:n]) == spec.ID()
}

// Populate copies the ready dataset on pool into target, the root of a freshly formatted,
// writable volume. It reflinks where source and target share a filesystem that supports it and
// copies in the kernel otherwise. The copy goes to a hidden directory, is synced, and only then
// moved into place: a volume never shows half a dataset. Populating an already populated volume is
// a no-op, so the user's later changes are never overwritten. version is the Status.Version the
// caller proved it may read (empty: any); a dataset replaced since is refused as changed.
func (c *Cache) Populate(ctx context.Context, pool string, spec *dataset.Spec, version, target string) error {
	id := spec.ID()
	if Populated(target, spec) {
		return nil
	}
	// The version is found and pinned under the pool's lock, which keeping and trimming versions
	// hold: it stays where it is while it is copied.
	pl := c.Lock(pool)
	pl.Lock()
	dir, err := versionDir(pool, spec, version)
	if err != nil {
		pl.Unlock()
		return err
	}
	defer c.PinReader(pool, filepath.Base(dir))()
	pl.Unlock()
	Touch(dir)
	tree := filepath.Join(dir, TreeDir)
	logger := klog.FromContext(ctx).WithValues("dataset", spec.String(), "target", target)

	root, err := os.OpenRoot(target)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.RemoveAll(populateTmp); err != nil {
		return err
	}
	if err := root.Mkdir(populateTmp, 0o755); err != nil {
		return err
	}
	if err := copyTree(ctx, tree, root, populateTmp); err != nil {
		_ = root.RemoveAll(populateTmp)
		return WriteErr(err)
	}
	tmp, err := root.Open(populateTmp)
	if err != nil {
		return err
	}
	err = unix.Syncfs(int(tmp.Fd()))
	names, rerr := tmp.Readdirnames(-1)
	tmp.Close()
	if err = errors.Join(err, rerr); err != nil {
		return err
	}
	for _, n := range names {
		// Left by an interrupted earlier attempt: the volume was never handed out.
		if err := root.RemoveAll(n); err != nil {
			return err
		}
		if err := root.Rename(path.Join(populateTmp, n), n); err != nil {
			return err
		}
	}
	if err := root.Remove(populateTmp); err != nil {
		return err
	}
	if err := unix.Setxattr(target, populatedXattr, []byte(id), 0); err != nil {
		return err
	}
	if err := SyncDir(target); err != nil {
		return err
	}
	logger.V(2).Info("volume populated from cached dataset")
	return nil
}

// copyTree copies the tree at src into dst/under, files in parallel.
func copyTree(ctx context.Context, src string, dst *os.Root, under string) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	files := make(chan string, 64)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for rel := range files {
				if ctx.Err() != nil {
					continue
				}
				if err := copyFile(filepath.Join(src, rel), dst, path.Join(under, rel)); err != nil {
					cancel(err)
				}
			}
		})
	}
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		rel, err := filepath.Rel(src, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch t := d.Type(); {
		case t.IsDir():
			return dst.Mkdir(path.Join(under, rel), 0o755)
		case t&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return dst.Symlink(l, path.Join(under, rel))
		case t.IsRegular():
			select {
			case files <- rel:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		return nil
	})
	close(files)
	wg.Wait()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

func copyFile(src string, dst *os.Root, name string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := dst.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, fi.Mode().Perm())
	if err != nil {
		return err
	}
	// Reflink when possible; otherwise ReadFrom uses copy_file_range, splice or a plain copy.
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) != nil {
		_, err = out.ReadFrom(io.LimitReader(in, fi.Size()))
	}
	return errors.Join(err, out.Close())
}

// WriteErr is a write's error, with a full pool or quota told as NoSpace.
func WriteErr(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return source.Wrap(source.NoSpace, err, "pool is full")
	}
	return err
}
