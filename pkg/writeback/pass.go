package writeback

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/cistern-csi/cistern/pkg/overlayfs"
)

// run is one Run of a job.
type run struct {
	cfg    Config
	job    Job
	client *s3.Client
	j      *journal
	report func(Progress)
	// slots bounds the requests in flight.
	slots chan struct{}
	// live: a checkpoint, the pods still writing (Uploader.Checkpoint).
	live bool
	// nfs is the NFS target of this pass, mounted; nil for S3.
	nfs *nfsDest
	// upper and lower are the trees this pass reads files beneath (open.go); lower is nil
	// when no file comes from it.
	upper, lower *tree
	// patientHTTP is client's HTTP client without its response-header timeout (patient).
	patientHTTP aws.HTTPClient
	patientOnce sync.Once

	mu sync.Mutex
	p  Progress
	// reporting serialises the calls of report.
	reporting sync.Mutex
}

// file is a changed regular file of the upper directory.
type file struct {
	fileKey
	// id is the file the plan listed, which alone is read (open.go).
	id identity
	// from is where its bytes are when not in the upper directory: the dataset file a renamed
	// file or directory comes from, relative to the lower directory, which the pods did not
	// write.
	from string
}

// plan lists the job's files and, when asked, its deletions.
func (r *run) plan() (files []file, deletes []string, skipped int, err error) {
	var replaced []overlayfs.Change
	// A checkpoint leaves the files written since this instant for the next round.
	recent := time.Now().Add(-r.cfg.Settle).UnixNano()
	present := map[string]bool{}
	changes, err := overlayfs.Changes(r.job.Upper)
	if err != nil {
		return nil, nil, 0, err
	}
	for _, c := range changes {
		switch c.Kind {
		case overlayfs.Written:
			st, err := r.upper.stat(filepath.FromSlash(c.Path))
			if r.live && errors.Is(err, errNotPlanned) {
				r.deferred() // changed since the walk listed it: the next checkpoint sees it
				continue
			}
			if err != nil {
				return nil, nil, 0, err
			}
			if st.Mode&unix.S_IFMT != unix.S_IFREG {
				skipped++ // S3 has no symlinks, devices or sockets
				continue
			}
			present[c.Path] = true
			if r.live && st.Mtim.Nano() > recent {
				r.deferred()
				continue
			}
			files = append(files, file{fileKey: fileKey{Path: c.Path, Size: st.Size, MTime: st.Mtim.Nano()}, id: identityOf(&st)})
		case overlayfs.Deleted, overlayfs.Opaque:
			if r.job.Deletes {
				replaced = append(replaced, c)
			}
		case overlayfs.Metadata, overlayfs.Dir:
			moved, err := r.renamed(c)
			if err != nil {
				return nil, nil, 0, err
			}
			for _, f := range moved {
				present[f.Path] = true
			}
			files = append(files, moved...)
		}
	}
	if r.job.Deletes {
		if deletes, err = r.deletions(replaced, present); err != nil {
			return nil, nil, 0, err
		}
		deletes = append(deletes, r.orphans(present, deletes)...)
	}
	return files, deletes, skipped, nil
}

// renamed are the files a dataset file or directory renamed by the pods shows at their new
// paths (an overlay redirect: a metacopy file, or a directory), with the dataset's bytes: new
// paths in the pod's view. Below a renamed directory, what the upper directory holds of its own
// (written, deleted, renamed again, a directory made again) is left to its own entry. Without
// the lower directory, nothing.
func (r *run) renamed(c overlayfs.Change) ([]file, error) {
	if c.From == "" || r.job.Lower == "" || c.From == c.Path {
		return nil, nil // only the mode, owner or times changed, or nothing to read from
	}
	if !filepath.IsLocal(filepath.FromSlash(c.From)) {
		// Only the kernel writes the redirect (a trusted.* xattr); never read outside the layer.
		return nil, fmt.Errorf("%s: redirect %q leaves the dataset", c.Path, c.From)
	}
	root := filepath.Join(r.job.Lower, filepath.FromSlash(c.From))
	var out []file
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		to := path.Join(c.Path, filepath.ToSlash(rel))
		if p != root {
			if _, err := os.Lstat(filepath.Join(r.job.Upper, filepath.FromSlash(to))); err == nil {
				if d.IsDir() {
					return r.walkRenamedDir(to)
				}
				return nil // its own entry in the upper directory says what it is
			}
		}
		if !d.Type().IsRegular() {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		from, err := filepath.Rel(r.job.Lower, p)
		if err != nil {
			return err
		}
		out = append(out, file{fileKey: fileKey{Path: to, Size: st.Size, MTime: st.Mtim.Nano()}, id: identityOf(&st), from: from})
		return nil
	})
	return out, err
}

// walkRenamedDir says whether the walk of a renamed directory goes into a subdirectory the upper
// directory also holds: only a plain one (changes below it); one made again, deleted or renamed
// again has its own entry.
func (r *run) walkRenamedDir(to string) error {
	c, err := overlayfs.Classify(filepath.Join(r.job.Upper, filepath.FromSlash(to)))
	if err != nil || c.Kind != overlayfs.Dir || c.From != "" {
		return filepath.SkipDir
	}
	return nil
}

// orphans are the paths a checkpoint uploaded that the pods removed since without a whiteout
// (files they had made): gone from the volume, so deleted at the target too.
func (r *run) orphans(present map[string]bool, deletes []string) []string {
	var out []string
	listed := make(map[string]bool, len(deletes))
	for _, p := range deletes {
		listed[p] = true
	}
	for p := range r.j.donePaths() {
		if !present[p] && !listed[p] {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// deferred counts a file left for the next checkpoint.
func (r *run) deferred() {
	r.mu.Lock()
	r.p.Deferred++
	r.mu.Unlock()
}

// changed reports whether f was written since it was listed.
func changed(fh *os.File, f file) bool {
	fi, err := fh.Stat()
	return err != nil || fi.Size() != f.Size || fi.ModTime().UnixNano() != f.MTime
}

// deletions are the dataset paths the pods deleted: a whiteout's path, or every dataset file
// under a directory it hides or that an opaque directory (deleted and made again) replaces,
// unless written again. Without the lower directory, a whiteout's path stands for itself and
// every key below it, and an opaque directory for nothing (the kernel also marks the
// directories a pod makes opaque, and which of them replaced a dataset directory only the
// lower one tells).
func (r *run) deletions(replaced []overlayfs.Change, written map[string]bool) ([]string, error) {
	var out []string
	seen := map[string]bool{} // an opaque directory below another is walked twice
	for _, c := range replaced {
		if r.job.Lower == "" {
			if c.Kind == overlayfs.Deleted {
				out = append(out, c.Path)
			}
			continue
		}
		root := filepath.Join(r.job.Lower, filepath.FromSlash(c.Path))
		fi, err := os.Lstat(root)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue // nothing of the dataset there (a whiteout over a path the pod made)
		case err != nil:
			return nil, err
		case !fi.IsDir():
			if c.Kind == overlayfs.Deleted {
				out = append(out, c.Path)
			}
			continue
		}
		err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, err := filepath.Rel(r.job.Lower, p)
			if rel = filepath.ToSlash(rel); err == nil && !written[rel] && !seen[rel] {
				seen[rel] = true
				out = append(out, rel)
			}
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// pass uploads every file and makes every deletion not yet recorded, then records the job
// complete. Its first failure ends it; the next pass goes on from the journal.
func (r *run) pass(ctx context.Context) error {
	var err error
	if r.upper, err = openTree(r.job.Upper); err != nil {
		return err
	}
	defer func() { r.upper.close(); r.lower.close(); r.upper, r.lower = nil, nil }()
	files, deletes, skipped, err := r.plan()
	if err != nil {
		return err
	}
	for _, f := range files {
		if f.from != "" && r.lower == nil {
			if r.lower, err = openTree(r.job.Lower); err != nil {
				return err
			}
		}
	}
	if r.job.Target.NFS() {
		if r.nfs, err = dialNFS(r.job.Target, r.cfg.NFSUID, r.cfg.NFSGID); err != nil {
			return err
		}
		defer func() { r.nfs.close(); r.nfs = nil }()
	}
	r.mu.Lock()
	// A report with Err is one failed pass: the counts of this one go out without the last's.
	r.p.Err, r.p.RetryIn = nil, 0
	r.p.Files, r.p.FilesDone, r.p.Bytes, r.p.BytesDone, r.p.Skipped = len(files), 0, 0, 0, skipped
	r.p.Deletes, r.p.DeletesDone = len(deletes), 0
	for _, p := range deletes {
		if r.j.isDeleted(p) {
			r.p.DeletesDone++
		}
	}
	current := map[fileKey]bool{}
	for _, f := range files {
		current[f.fileKey] = true
		r.p.Bytes += f.Size
		if r.j.isDone(f.fileKey) {
			r.p.FilesDone++
			r.p.BytesDone += f.Size
		}
	}
	r.mu.Unlock()
	r.publish()
	if err := r.abortStale(ctx, current); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(r.cfg.Concurrency)
	for _, f := range files {
		if r.j.isDone(f.fileKey) {
			continue
		}
		g.Go(func() error { return r.upload(gctx, f) })
	}
	for _, p := range deletes {
		if !r.j.isDeleted(p) {
			g.Go(func() error { return r.delete(gctx, p) })
		}
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if r.live {
		return r.j.sync() // what this checkpoint did stays done across a crash
	}
	return r.j.append(record{Op: opComplete}, true)
}

// upload puts one file at its key, in parts when large, unless an earlier job of the volume put
// it there as it is and the target still holds it.
func (r *run) upload(ctx context.Context, f file) error {
	if p, ok := r.j.storedProof(f.fileKey); ok && r.stillStored(ctx, f, p) {
		return r.done(f, p)
	}
	t, rel := r.upper, filepath.FromSlash(f.Path)
	if f.from != "" {
		t, rel = r.lower, f.from
	}
	fh, err := t.open(rel, f)
	if r.live && errors.Is(err, errNotPlanned) {
		r.deferred() // changed since the plan: the next checkpoint plans it again
		return nil
	}
	if err != nil {
		// The final upload: the volume is no longer written, so its next pass plans what is
		// there now; other bytes in the place of the planned file are never sent.
		return fmt.Errorf("upload %s to %s: %w; not sent", f.Path, r.job.Target, err)
	}
	defer fh.Close()
	var p proof
	switch {
	case r.nfs != nil:
		p.Sum, err = r.nfs.put(ctx, fh, f.Size, f.Path, func() bool { return !r.live || !changed(fh, f) })
		if err == nil {
			r.sent(f.Size)
		}
	case f.Size >= r.cfg.PartSize:
		p, err = r.multipart(ctx, fh, f)
	default:
		p, err = r.put(ctx, fh, f)
	}
	if r.live && changed(fh, f) {
		// Written while it was sent: left for the next round. The server refused a torn small
		// file (its checksum was computed first), and a multipart upload is not completed; the
		// next pass aborts it.
		r.deferred()
		return nil
	}
	if err != nil {
		return fmt.Errorf("upload %s to %s: %w", f.Path, r.job.Target, err)
	}
	// A file written while it was read would be recorded with content it does not have.
	if changed(fh, f) {
		return fmt.Errorf("%s changed while it was uploaded", f.Path)
	}
	return r.done(f, p)
}

// done records f's object at the target, with how the server confirmed it.
func (r *run) done(f file, p proof) error {
	if err := r.j.append(doneRecord(f.fileKey, p), false); err != nil {
		return err
	}
	r.mu.Lock()
	r.p.FilesDone++
	r.p.BytesDone += f.Size
	r.mu.Unlock()
	return nil
}

// stillStored reports whether the target holds f's object as an earlier job put it there: its
// size and what confirmed it then, the checksum or (a server without flexible checksums) the MD5
// ETag that job recorded (S3: a HEAD; NFS: the file read back).
func (r *run) stillStored(ctx context.Context, f file, p proof) bool {
	if p.Sum == "" && !p.byMD5() {
		return false
	}
	if r.nfs != nil {
		return p.Sum != "" && r.nfs.verify(f.Path, f.Size, p.Sum) == nil
	}
	release, err := r.slot(ctx)
	if err != nil {
		return false
	}
	defer release()
	out := r.headOf(ctx, f)
	switch {
	case out == nil:
		return false
	case p.byMD5():
		return normETag(out.ETag) == p.ETag
	}
	return aws.ToString(out.ChecksumCRC32C) == p.Sum || aws.ToString(out.ChecksumCRC64NVME) == p.Sum
}

// put uploads a small file in one request, with its CRC-32C and Content-MD5, read from the file
// before it is sent: a write while it is sent (a checkpoint) makes the server refuse the bytes,
// so a torn file never shows at the target. The server's answer confirms them (confirm).
func (r *run) put(ctx context.Context, fh *os.File, f file) (proof, error) {
	release, err := r.slot(ctx)
	if err != nil {
		return proof{}, err
	}
	defer release()
	sums, err := algCRC32C.sums(fh, 0, f.Size)
	if err != nil {
		return proof{}, err
	}
	out, err := r.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(r.job.Target.Bucket), Key: aws.String(r.job.Target.key(f.Path)),
		Body: io.NewSectionReader(fh, 0, f.Size), ContentLength: aws.Int64(f.Size),
		ChecksumAlgorithm: algCRC32C.algorithm(), ChecksumCRC32C: aws.String(sums.sum), ContentMD5: sums.contentMD5(),
	})
	if err != nil {
		return proof{}, err
	}
	r.sent(f.Size)
	return confirm(sums, algCRC32C.pick(out.ChecksumCRC32C, out.ChecksumCRC64NVME), out.ETag)
}

// delete removes the objects of a path the pods deleted: its key, and, when the job knows no
// lower directory to tell, every key below it (the path may have been a directory).
func (r *run) delete(ctx context.Context, p string) error {
	if r.nfs != nil {
		if err := r.nfs.remove(p, r.job.Lower == ""); err != nil {
			return fmt.Errorf("delete %s at %s: %w", p, r.job.Target, err)
		}
		return r.deleted(p)
	}
	key := r.job.Target.key(p)
	keys := []string{key}
	pages := s3.NewListObjectsV2Paginator(r.client, &s3.ListObjectsV2Input{
		Bucket: aws.String(r.job.Target.Bucket), Prefix: aws.String(key + "/"),
	})
	for r.job.Lower == "" && pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("list %s under %s: %w", p, r.job.Target, err)
		}
		for _, o := range page.Contents {
			keys = append(keys, aws.ToString(o.Key))
		}
	}
	for _, k := range keys {
		release, err := r.slot(ctx)
		if err != nil {
			return err
		}
		_, err = r.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(r.job.Target.Bucket), Key: aws.String(k)})
		release()
		if err != nil {
			return fmt.Errorf("delete %s at %s: %w", strings.TrimPrefix(k, r.job.Target.Prefix), r.job.Target, err)
		}
	}
	return r.deleted(p)
}

// deleted records a path's objects deleted.
func (r *run) deleted(p string) error {
	if err := r.j.append(record{Op: opDeleted, Path: p}, false); err != nil {
		return err
	}
	r.mu.Lock()
	r.p.DeletesDone++
	r.mu.Unlock()
	return nil
}

// slot waits for a request slot.
func (r *run) slot(ctx context.Context) (func(), error) {
	select {
	case r.slots <- struct{}{}:
		return func() { <-r.slots }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (r *run) sent(n int64) {
	r.mu.Lock()
	r.p.Sent += n
	r.mu.Unlock()
}

// publish reports the progress.
func (r *run) publish() {
	if r.report == nil {
		return
	}
	r.reporting.Lock()
	defer r.reporting.Unlock()
	r.mu.Lock()
	p := r.p
	r.mu.Unlock()
	r.report(p)
}

// isMissing reports an S3 answer that a thing is not there. The SDK types only the errors its
// model lists for an operation: ListParts' and CompleteMultipartUpload's NoSuchUpload arrive
// as a generic API error with that code, and were not recognised, so that a journal whose
// upload the server had completed (its answer lost: a timeout, a crash) failed every pass.
func isMissing(err error) bool {
	var nsu *types.NoSuchUpload
	var nsk *types.NoSuchKey
	var nf *types.NotFound
	if errors.As(err, &nsu) || errors.As(err, &nsk) || errors.As(err, &nf) || errors.Is(err, fs.ErrNotExist) {
		return true
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "NoSuchUpload", "NoSuchKey", "NotFound":
			return true
		}
	}
	return false
}
