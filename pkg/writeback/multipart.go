package writeback

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"golang.org/x/sync/errgroup"
)

// partSize is the part size for a file of size bytes: the configured one, larger when the file
// would need more than S3's 10,000 parts.
func (r *run) partSize(size int64) int64 {
	ps := r.cfg.PartSize
	for (size+ps-1)/ps > 10000 {
		ps *= 2
	}
	return ps
}

// multipart uploads a large file in parts, resuming the upload the journal recorded: a part the
// server holds whose checksum is the one recorded for it, or of the file's bytes, is not sent
// again. Each part's checksum (CRC-32C; checksum.go) is verified by the server as it arrives,
// and the completed object is a FULL_OBJECT checksum that the server composes from them.
func (r *run) multipart(ctx context.Context, fh *os.File, f file) (string, error) {
	t := r.job.Target
	bucket, key := aws.String(t.Bucket), aws.String(t.key(f.Path))
	held := map[int32]types.Part{}
	up := r.j.uploadOf(f.fileKey)
	if up != nil {
		parts, err := r.listParts(ctx, up.ID, bucket, key)
		switch {
		case isMissing(err):
			// Completed before the crash could record it, or aborted: the object tells which.
			if sum, ok := r.alreadyStored(ctx, fh, f, up.Alg); ok {
				return sum, nil
			}
			up = nil
		case err != nil:
			return "", err
		default:
			held = parts
		}
	}
	if up == nil {
		out, err := r.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{
			Bucket: bucket, Key: key,
			ChecksumAlgorithm: algCRC32C.algorithm(), ChecksumType: types.ChecksumTypeFullObject,
		})
		if err != nil {
			return "", err
		}
		up = &upload{ID: aws.ToString(out.UploadId), Alg: algCRC32C}
		// Synced: an upload the journal forgot would hold storage on the server for ever.
		if err := r.j.append(record{Op: opUpload, Path: f.Path, Size: f.Size, MTime: f.MTime, Upload: up.ID, Alg: up.Alg}, true); err != nil {
			return "", err
		}
	}
	parts, err := r.sendParts(ctx, fh, f, up, held)
	if err != nil {
		return "", err
	}
	if r.live && changed(fh, f) {
		return "", errors.New("written while it was sent") // never completed: the next pass aborts it
	}
	return r.complete(ctx, fh, f, up, parts)
}

// completeTimeout bounds how long a server may take to assemble an object.
const completeTimeout = 30 * time.Minute

// complete asks the server to assemble the object from its parts. A server may answer only once
// it has copied every part into the object (versitygw's posix backend does: 2-4 s for 2 GiB in
// 410 parts on the shared test machine, more on a busier disk), which can take longer than the
// node's S3 clients wait for response headers (30 s, right for reads). The SDK then sends
// Complete again while the server is still assembling, and versitygw answers that one with
// success but no checksum. So Complete waits for its answer without that timeout, up to
// completeTimeout (TestSlowComplete); an upload the server no longer knows (a retry after an
// answer lost on the way) is taken as done when the object at the key is this file
// (TestCompleteAnswerLost).
func (r *run) complete(ctx context.Context, fh *os.File, f file, up *upload, parts []types.CompletedPart) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, completeTimeout)
	defer cancel()
	out, err := r.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket: aws.String(r.job.Target.Bucket), Key: aws.String(r.job.Target.key(f.Path)), UploadId: aws.String(up.ID),
		ChecksumType:    types.ChecksumTypeFullObject,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
	}, r.patient)
	if isMissing(err) {
		if sum, ok := r.alreadyStored(ctx, fh, f, up.Alg); ok {
			return sum, nil
		}
	}
	if err != nil {
		return "", err
	}
	return verified(up.Alg.pick(out.ChecksumCRC32C, out.ChecksumCRC64NVME))
}

// patient has a request wait for its answer without the client's response-header timeout
// (see complete), on a transport of its own made once per run.
func (r *run) patient(o *s3.Options) {
	r.patientOnce.Do(func() {
		r.patientHTTP = o.HTTPClient
		hc, ok := o.HTTPClient.(*http.Client)
		if !ok {
			return
		}
		tr, ok := hc.Transport.(*http.Transport)
		if !ok || tr.ResponseHeaderTimeout == 0 {
			return
		}
		tr = tr.Clone()
		tr.ResponseHeaderTimeout = 0
		c := *hc
		c.Transport = tr
		r.patientHTTP = &c
	})
	o.HTTPClient = r.patientHTTP
}

// closePatient closes the idle connections of patient's transport, when it made one.
func (r *run) closePatient() {
	if c, ok := r.patientHTTP.(*http.Client); ok && r.client != nil && c != r.client.Options().HTTPClient {
		c.CloseIdleConnections()
	}
}

// sendParts sends the parts the server does not hold yet, in parallel.
func (r *run) sendParts(ctx context.Context, fh *os.File, f file, up *upload, held map[int32]types.Part) ([]types.CompletedPart, error) {
	ps := r.partSize(f.Size)
	n := int((f.Size + ps - 1) / ps)
	parts := make([]types.CompletedPart, n)
	// A failed part stops new ones but cancels none under way: a request cancelled mid-body
	// may still be written by the server after the upload is aborted (versitygw then lists the
	// aborted upload again, holding storage), so every request ends before this returns.
	var g errgroup.Group
	var failed atomic.Bool
	for i := range n {
		num, off := int32(i+1), int64(i)*ps
		length := min(ps, f.Size-off)
		if p, ok := held[num]; ok && aws.ToInt64(p.Size) == length && r.sameBytes(fh, off, length, up, p) {
			parts[i] = up.Alg.part(num, p.ETag, up.Alg.pick(p.ChecksumCRC32C, p.ChecksumCRC64NVME))
			continue
		}
		if failed.Load() {
			break
		}
		release, err := r.slot(ctx)
		if err != nil {
			break
		}
		g.Go(func() error {
			defer release()
			out, err := r.client.UploadPart(ctx, &s3.UploadPartInput{
				Bucket: aws.String(r.job.Target.Bucket), Key: aws.String(r.job.Target.key(f.Path)),
				UploadId: aws.String(up.ID), PartNumber: aws.Int32(num),
				Body: io.NewSectionReader(fh, off, length), ContentLength: aws.Int64(length),
				ChecksumAlgorithm: up.Alg.algorithm(),
			})
			var sum string
			if err == nil {
				sum, err = verified(up.Alg.pick(out.ChecksumCRC32C, out.ChecksumCRC64NVME))
			}
			if err != nil {
				failed.Store(true)
				return err
			}
			r.sent(length)
			parts[i] = up.Alg.part(num, out.ETag, sum)
			if err := r.j.append(record{Op: opPart, Path: f.Path, Size: f.Size, MTime: f.MTime, Upload: up.ID,
				Part: num, ETag: aws.ToString(out.ETag), Sum: sum}, false); err != nil {
				failed.Store(true)
				return err
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return parts, ctx.Err()
}

// sameBytes reports whether a part the server holds is the file's bytes at off: its checksum is
// the one the journal recorded when it was sent, or (sent but not recorded before a crash) the
// checksum of those bytes now, in the upload's algorithm.
func (r *run) sameBytes(fh *os.File, off, n int64, up *upload, p types.Part) bool {
	have := up.Alg.pick(p.ChecksumCRC32C, p.ChecksumCRC64NVME)
	if have == "" {
		return false
	}
	if rec := up.Parts[aws.ToInt32(p.PartNumber)]; rec.Sum != "" {
		return rec.Sum == have && rec.ETag == aws.ToString(p.ETag)
	}
	sum, err := up.Alg.of(fh, off, n)
	return err == nil && sum == have
}

// listParts returns the parts the server holds of an upload.
func (r *run) listParts(ctx context.Context, id string, bucket, key *string) (map[int32]types.Part, error) {
	out := map[int32]types.Part{}
	pages := s3.NewListPartsPaginator(r.client, &s3.ListPartsInput{Bucket: bucket, Key: key, UploadId: aws.String(id)})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, err
		}
		for _, p := range page.Parts {
			out[aws.ToInt32(p.PartNumber)] = p
		}
	}
	return out, nil
}

// alreadyStored reports whether the object at f's key is f, whole: its size and its FULL_OBJECT
// checksum of alg (the algorithm of the upload that would have made it).
func (r *run) alreadyStored(ctx context.Context, fh *os.File, f file, alg sumAlg) (string, bool) {
	out := r.headOf(ctx, f)
	if out == nil || out.ChecksumType != types.ChecksumTypeFullObject {
		return "", false
	}
	have := alg.pick(out.ChecksumCRC32C, out.ChecksumCRC64NVME)
	if have == "" {
		return "", false
	}
	sum, err := alg.of(fh, 0, f.Size)
	if err != nil || sum != have {
		return "", false
	}
	return sum, true
}

// headOf is the HEAD of the object at f's key, with its checksums; nil when there is none of f's
// size.
func (r *run) headOf(ctx context.Context, f file) *s3.HeadObjectOutput {
	out, err := r.client.HeadObject(ctx, &s3.HeadObjectInput{
		Bucket: aws.String(r.job.Target.Bucket), Key: aws.String(r.job.Target.key(f.Path)),
		ChecksumMode: types.ChecksumModeEnabled,
	})
	if err != nil || aws.ToInt64(out.ContentLength) != f.Size {
		return nil
	}
	return out
}

// abortStale aborts the multipart uploads the journal started for files since changed or gone.
func (r *run) abortStale(ctx context.Context, current map[fileKey]bool) error {
	if r.nfs != nil {
		return nil // files go whole: no upload to abort
	}
	for k, id := range r.j.staleUploads(current) {
		_, err := r.client.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{
			Bucket: aws.String(r.job.Target.Bucket), Key: aws.String(r.job.Target.key(k.Path)), UploadId: aws.String(id),
		})
		if err != nil && !isMissing(err) {
			return err
		}
		if err := r.j.append(record{Op: opAborted, Path: k.Path, Size: k.Size, MTime: k.MTime, Upload: id}, false); err != nil {
			return err
		}
	}
	return nil
}
