package stage

// The manifest: the listing that is the dataset's point in time, taken once and kept across
// restarts only for a caller that proves it reads the same data.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource/access"
	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/pkg/units"
)

// manifest returns the committed manifest, listing the source first if there is none yet. The
// listing is the dataset's point in time: reads are pinned to the ETags it records. A manifest
// left by an earlier attempt (perhaps another caller's, before a restart) is kept only when this
// job's caller proves it reads the same data; otherwise what was staged is discarded.
func (j *Job) manifest(ctx context.Context) (*cache.Meta, error) {
	if md, err := j.resumed(ctx); md != nil || err != nil {
		return md, err
	}
	j.phase.Store(PhaseListing)
	md := &cache.Meta{Spec: j.spec, Created: time.Now().UTC()}
	filter := j.e.cfg.Limits.Filter(j.spec)
	var digest cache.Digester
	tmp := filepath.Join(j.dir, cache.ObjectsFile+".tmp")
	err := cache.WriteAtomic(filepath.Join(j.dir, cache.ObjectsFile), func(f *os.File) error {
		bw := bufio.NewWriterSize(f, 256<<10)
		written := &countingWriter{w: bw}
		enc := json.NewEncoder(written)
		limits := j.e.cfg.Limits
		var listed int64
		// Within the node's listing slots, and only while the source keeps listing.
		err := j.e.cfg.Listings.Source(j.spec, j.src).List(ctx, func(o source.Object) error {
			if listed++; listed > limits.MaxObjects {
				return limits.CheckListed(listed)
			}
			keep, err := cache.KeepEntry(limits, filter, o)
			if err != nil || !keep {
				return err
			}
			md.Objects++
			md.Bytes += o.Size
			md.Alloc += cache.EntryAlloc(o)
			j.objsTotal.Store(md.Objects)
			j.bytesTotal.Store(md.Bytes)
			// Refuse as soon as it is known, before any download.
			if err := limits.CheckTotals(md.Objects, md.Bytes); err != nil {
				return err
			}
			if err := CheckCapacity(j.capacity, md.Bytes, md.Alloc, false); err != nil {
				return err
			}

			if err := digest.Add(o); err != nil {
				return err
			}
			if err := enc.Encode(o); err != nil {
				return err
			}
			if written.n > limits.MaxManifestBytes {
				return source.Errorf(source.TooLarge, "its manifest is larger than %s, the most a dataset may have on this node", units.HumanBytes(limits.MaxManifestBytes))
			}
			return nil
		})
		if err != nil {
			return err
		}
		if err := bw.Flush(); err != nil {
			return err
		}
		md.Digest = digest.Sum()
		// meta.json first: objects.jsonl appearing is the commit point.
		return cache.WriteMeta(j.dir, md)
	})
	os.Remove(tmp)
	if err != nil {
		return nil, err
	}
	return md, nil
}

// setAside takes an earlier attempt's directory away from this job when volumes reference it
// (streaming volumes read what it committed, held by descriptor) and this job's caller sees
// other data: retired, so that the job stages in a fresh directory instead of discarding those
// files and staging another version in their place. The same data is resumed in place, as
// always (resumed).
func (j *Job) setAside(ctx context.Context) error {
	if !cache.ManifestExists(j.dir) || cache.RefCount(j.dir) == 0 {
		return nil
	}
	md, err := cache.ReadMeta(j.dir)
	if err != nil {
		return nil // resumed lists anew
	}
	switch err := j.checkResume(ctx, md); {
	case err == nil:
		j.proved = md
		return nil
	case !errors.Is(err, access.ErrListingDiffers):
		return err
	}
	klog.FromContext(ctx).Info("retiring a partial staging that streaming volumes read: the source's listing differs from its manifest")
	return j.e.cfg.Cache.Discard(j.pool, j.dir)
}

// resumed returns the manifest an earlier attempt left, when this job's caller proves it reads
// the same data; nil when there is none, or it was discarded.
func (j *Job) resumed(ctx context.Context) (*cache.Meta, error) {
	if md := j.proved; md != nil {
		return md, nil // setAside proved it
	}
	if !cache.ManifestExists(j.dir) {
		return nil, nil
	}
	md, err := cache.ReadMeta(j.dir)
	if err != nil {
		return nil, nil
	}
	err = j.checkResume(ctx, md)
	if err == nil {
		return md, nil
	}
	if !errors.Is(err, access.ErrListingDiffers) {
		return nil, err
	}
	klog.FromContext(ctx).Info("discarding a partial staging: the source's listing differs from its manifest")
	return nil, j.discard()
}

// checkResume proves that this job's caller reads the data of the manifest an earlier attempt
// left, as a cache hit does (package access): its own listing matches, and it may read every
// file.
func (j *Job) checkResume(ctx context.Context, md *cache.Meta) error {
	digest, err := cache.ManifestDigest(j.dir, md)
	if err != nil {
		return err
	}
	md.Digest = digest
	return j.access.Prove(ctx, j.dir, md, digest)
}

// discard removes what an earlier attempt staged under a manifest this caller cannot use.
func (j *Job) discard() error {
	if err := os.Remove(filepath.Join(j.dir, cache.ObjectsFile)); err != nil && !cache.IsNotExist(err) {
		return err
	}
	staging := filepath.Join(j.dir, cache.StagingDir)
	ents, err := os.ReadDir(staging)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(staging, e.Name())); err != nil {
			return err
		}
	}
	j.resuming = false
	return cache.SyncDir(j.dir)
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
