package stage

// Commits: a verified file renamed into staging/, and the whole tree synced once and published
// as tree/.

import (
	"context"
	"errors"
	"os"
	"path"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/pkg/testpoint"
)

func fileMode(o source.Object) os.FileMode {
	if o.Mode&0o777 == 0 {
		return 0o644
	}
	return os.FileMode(o.Mode&0o777) | 0o444 // always readable: volumes are read by any pod user
}

// commit moves a verified file to its place in staging/.
func (j *Job) commit(i int64, o source.Object) error {
	dst, err := j.dirs.mkdir(path.Join(cache.StagingDir, path.Dir(o.Key)))
	if err != nil {
		return err
	}
	if err := j.dirs.rename(j.tmpDirOf(i), tmpBase(i), dst, path.Base(o.Key)); err != nil {
		return conflictErr(o.Key, err)
	}
	j.objsDone.Add(1)
	testpoint.Reach(testpoint.StagingFileCommitted, j.id)
	j.peers.holding.Commit(j.peers.rank(i))
	j.prefer.committed(i)
	return nil
}

func (j *Job) mkdirs(dir string) error {
	_, err := j.dirs.mkdir(dir)
	return err
}

func conflictErr(key string, err error) error {
	if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.EEXIST) {
		return source.Wrap(source.Invalid, err, "entry %q conflicts with another entry (a file and a directory of the same name)", key)
	}
	return cache.WriteErr(err)
}

// finish creates symlinks, syncs once and publishes staging/ as tree/.
func (j *Job) finish(ctx context.Context, md *cache.Meta) error {
	err := cache.EachObject(j.dir, func(_ int64, o source.Object) error {
		if o.Type != source.Symlink {
			return nil
		}
		if err := source.ValidateSymlink(o.Key, o.Target); err != nil {
			return err
		}
		if dir := path.Dir(o.Key); dir != "." {
			if err := j.mkdirs(path.Join(cache.StagingDir, dir)); err != nil {
				return err
			}
		}
		name := path.Join(cache.StagingDir, o.Key)
		if t, err := j.root.Readlink(name); err == nil && t == o.Target {
			j.objsDone.Add(1)
			return nil
		}
		if err := j.root.Symlink(o.Target, name); err != nil {
			return conflictErr(o.Key, err)
		}
		j.objsDone.Add(1)
		return nil
	})
	if err != nil {
		return err
	}
	// One sync for the whole dataset, then the rename that makes it visible.
	d, err := j.root.Open(cache.StagingDir)
	if err != nil {
		return err
	}
	err = unix.Syncfs(int(d.Fd()))
	d.Close()
	if err != nil {
		return err
	}
	testpoint.Reach(testpoint.StagingSynced, j.id)
	if err := j.root.Rename(cache.StagingDir, cache.TreeDir); err != nil {
		return err
	}
	if err := cache.SyncDir(j.dir); err != nil {
		return err
	}
	_ = os.RemoveAll(filepath.Join(j.dir, cache.TmpDir))
	md.Ready = time.Now().UTC()
	cache.Touch(j.dir)
	return cache.WriteMeta(j.dir, md)
}
