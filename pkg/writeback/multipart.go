package writeback

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"golang.org/x/sync/errgroup"

	"github.com/cistern-csi/cistern/pkg/datasource/etag"
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

// partSizeMeta is the user metadata (x-amz-meta-cistern-part-size) a multipart object is
// created with: its part size in bytes, so that a reader of a server that does not tell it
// (HEAD ?partNumber= ignored) can check the object's multipart ETag against its bytes.
const partSizeMeta = "cistern-part-size"

// upPartSize is the part size of up (the configured one for an upload a journal started
// without recording it).
func (r *run) upPartSize(up *upload, f file) int64 {
	if up != nil && up.PartSize > 0 {
		return up.PartSize
	}
	return r.partSize(f.Size)
}

// multipart uploads a large file in parts, resuming the upload the journal recorded: a part the
// server holds that the journal or the file's bytes confirm (heldPart) is not sent again. Each
// part goes with its checksum (CRC-32C; checksum.go) and its Content-MD5, and is confirmed by
// the checksum the server answers or, from a server without flexible checksums, by its ETag,
// the part's MD5; the completed object by its FULL_OBJECT checksum, which the server composes
// from the parts', or by its multipart ETag.
func (r *run) multipart(ctx context.Context, fh *os.File, f file) (proof, error) {
	t := r.job.Target
	bucket, key := aws.String(t.Bucket), aws.String(t.key(f.Path))
	held := map[int32]types.Part{}
	up := r.j.uploadOf(f.fileKey)
	if up != nil {
		parts, err := r.listParts(ctx, up.ID, bucket, key)
		switch {
		case isMissing(err):
			// Completed before the crash could record it, or aborted: the object tells which.
			if p, ok := r.alreadyStored(ctx, fh, f, up); ok {
				return p, nil
			}
			up = nil
		case err != nil:
			return proof{}, err
		default:
			held = parts
		}
	}
	if up == nil {
		ps := r.partSize(f.Size)
		out, err := r.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{
			Bucket: bucket, Key: key,
			ChecksumAlgorithm: algCRC32C.algorithm(), ChecksumType: types.ChecksumTypeFullObject,
			Metadata: map[string]string{partSizeMeta: strconv.FormatInt(ps, 10)},
		})
		if err != nil {
			return proof{}, err
		}
		up = &upload{ID: aws.ToString(out.UploadId), Alg: algCRC32C, PartSize: ps}
		// Synced: an upload the journal forgot would hold storage on the server for ever.
		if err := r.j.append(record{Op: opUpload, Path: f.Path, Size: f.Size, MTime: f.MTime, Upload: up.ID, Alg: up.Alg,
			PartSize: ps}, true); err != nil {
			return proof{}, err
		}
	}
	parts, err := r.sendParts(ctx, fh, f, up, held)
	if err != nil {
		return proof{}, err
	}
	if r.live && changed(fh, f) {
		return proof{}, errors.New("written while it was sent") // never completed: the next pass aborts it
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
func (r *run) complete(ctx context.Context, fh *os.File, f file, up *upload, sent sentParts) (proof, error) {
	ctx, cancel := context.WithTimeout(ctx, completeTimeout)
	defer cancel()
	out, err := r.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket: aws.String(r.job.Target.Bucket), Key: aws.String(r.job.Target.key(f.Path)), UploadId: aws.String(up.ID),
		ChecksumType:    types.ChecksumTypeFullObject,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: sent.parts},
	}, r.patient)
	if isMissing(err) {
		if p, ok := r.alreadyStored(ctx, fh, f, up); ok {
			return p, nil
		}
	}
	if err != nil {
		return proof{}, err
	}
	ps := r.upPartSize(up, f)
	if sum := up.Alg.pick(out.ChecksumCRC32C, out.ChecksumCRC64NVME); sum != "" {
		return proof{Sum: sum, PartSize: ps}, nil
	}
	// No checksum: a server without flexible checksums, or one answering a Complete sent again
	// while it assembled the object (versitygw). Its ETag is then the parts' multipart ETag.
	want, err := sent.etag(fh, f.Size, ps)
	if err != nil {
		return proof{}, err
	}
	tag := out.ETag
	if normETag(tag) == "" {
		tag = r.completedETag(ctx, f, out.VersionId)
	}
	if normETag(tag) != want {
		return proof{}, unconfirmed(tag)
	}
	return proof{ETag: want, PartSize: ps}, nil
}

// completedETag is the ETag of the object Complete made, for a server that answered Complete
// with an empty one (Ceph RGW 16 does, though its HEAD then gives the multipart ETag): the
// version Complete named, or else the object at the key, which holds this file only if that
// ETag is the one its parts make.
func (r *run) completedETag(ctx context.Context, f file, version *string) *string {
	out, err := r.client.HeadObject(ctx, &s3.HeadObjectInput{
		Bucket: aws.String(r.job.Target.Bucket), Key: aws.String(r.job.Target.key(f.Path)), VersionId: version,
	})
	if err != nil || aws.ToInt64(out.ContentLength) != f.Size {
		return nil
	}
	return out.ETag
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

// sentParts are an upload's parts as Complete names them, and each part's MD5 where this pass
// knows it (sent by it, or its ETag confirmed as the MD5), for the multipart ETag.
type sentParts struct {
	parts []types.CompletedPart
	md5s  [][]byte
}

// etag is the multipart ETag of the parts, of ps bytes each: the MD5s this pass does not know
// are read from the file.
func (s sentParts) etag(fh *os.File, size, ps int64) (string, error) {
	for i, m := range s.md5s {
		if m == nil {
			off := int64(i) * ps
			var err error
			if s.md5s[i], err = md5Of(fh, off, min(ps, size-off)); err != nil {
				return "", err
			}
		}
	}
	return etag.Of(slices.Concat(s.md5s...)), nil
}

// sendParts sends the parts the server does not hold yet, in parallel.
func (r *run) sendParts(ctx context.Context, fh *os.File, f file, up *upload, held map[int32]types.Part) (sentParts, error) {
	ps := r.upPartSize(up, f)
	n := int((f.Size + ps - 1) / ps)
	out := sentParts{parts: make([]types.CompletedPart, n), md5s: make([][]byte, n)}
	// A failed part stops new ones but cancels none under way: a request cancelled mid-body
	// may still be written by the server after the upload is aborted (versitygw then lists the
	// aborted upload again, holding storage), so every request ends before this returns.
	var g errgroup.Group
	var failed atomic.Bool
	for i := range n {
		num, off := int32(i+1), int64(i)*ps
		length := min(ps, f.Size-off)
		if p, ok := held[num]; ok && aws.ToInt64(p.Size) == length {
			if cp, m, ok := r.heldPart(fh, off, length, up, p); ok {
				out.parts[i], out.md5s[i] = cp, m
				continue
			}
		}
		if failed.Load() {
			break
		}
		release, err := r.slot(ctx)
		if err != nil {
			break
		}
		if failed.Load() { // a part failed while this one waited for its slot
			release()
			break
		}
		g.Go(func() error {
			defer release()
			cp, m, err := r.sendPart(ctx, fh, f, up, num, off, length)
			if err != nil {
				failed.Store(true)
				return err
			}
			out.parts[i], out.md5s[i] = cp, m
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return sentParts{}, err
	}
	return out, ctx.Err()
}

// sendPart sends one part with its checksum and Content-MD5, read from the file first, and
// records it once the server confirmed it.
func (r *run) sendPart(ctx context.Context, fh *os.File, f file, up *upload, num int32, off, length int64) (types.CompletedPart, []byte, error) {
	sums, err := up.Alg.sums(fh, off, length)
	if err != nil {
		return types.CompletedPart{}, nil, err
	}
	in := &s3.UploadPartInput{
		Bucket: aws.String(r.job.Target.Bucket), Key: aws.String(r.job.Target.key(f.Path)),
		UploadId: aws.String(up.ID), PartNumber: aws.Int32(num),
		Body: io.NewSectionReader(fh, off, length), ContentLength: aws.Int64(length),
		ChecksumAlgorithm: up.Alg.algorithm(), ContentMD5: sums.contentMD5(),
	}
	if up.Alg == algCRC64NVME {
		in.ChecksumCRC64NVME = aws.String(sums.sum)
	} else {
		in.ChecksumCRC32C = aws.String(sums.sum)
	}
	out, err := r.client.UploadPart(ctx, in)
	if err != nil {
		return types.CompletedPart{}, nil, err
	}
	p, err := confirm(sums, up.Alg.pick(out.ChecksumCRC32C, out.ChecksumCRC64NVME), out.ETag)
	if err != nil {
		return types.CompletedPart{}, nil, fmt.Errorf("part %d: %w", num, err)
	}
	r.sent(length)
	rec := record{Op: opPart, Path: f.Path, Size: f.Size, MTime: f.MTime, Upload: up.ID, Part: num, ETag: aws.ToString(out.ETag), Sum: sums.sum}
	if p.byMD5() {
		rec.Confirm = confirmMD5
	}
	if err := r.j.append(rec, false); err != nil {
		return types.CompletedPart{}, nil, err
	}
	return up.Alg.part(num, out.ETag, sums.sum), sums.md5, nil
}

// heldPart says whether a part the server holds is the file's bytes at off, and what completes
// the upload with it (its checksum, and its MD5 when known). A part the journal recorded is
// checked as it was confirmed when sent: the checksum and ETag the server lists are the
// recorded ones, or (confirmed by MD5) its ETag is. One sent but not recorded before a crash is
// checked against the file's bytes now: their checksum, or, from a server that lists none, their
// MD5, which an MD5 ETag is.
func (r *run) heldPart(fh *os.File, off, n int64, up *upload, p types.Part) (types.CompletedPart, []byte, bool) {
	num := aws.ToInt32(p.PartNumber)
	have := up.Alg.pick(p.ChecksumCRC32C, p.ChecksumCRC64NVME)
	rec, recorded := up.Parts[num]
	switch {
	case recorded && rec.Confirm == confirmMD5:
		etag := normETag(&rec.ETag)
		m, err := hex.DecodeString(etag)
		return up.Alg.part(num, p.ETag, rec.Sum), m, err == nil && rec.Sum != "" && normETag(p.ETag) == etag
	case recorded && rec.Sum != "":
		return up.Alg.part(num, p.ETag, have), nil, have != "" && rec.Sum == have && rec.ETag == aws.ToString(p.ETag)
	}
	sums, err := up.Alg.sums(fh, off, n)
	if err != nil {
		return types.CompletedPart{}, nil, false
	}
	md5hex := hex.EncodeToString(sums.md5)
	if have != "" {
		var m []byte
		if normETag(p.ETag) == md5hex {
			m = sums.md5
		}
		return up.Alg.part(num, p.ETag, have), m, sums.sum == have
	}
	return up.Alg.part(num, p.ETag, sums.sum), sums.md5, normETag(p.ETag) == md5hex
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

// alreadyStored reports whether the object at f's key is f, whole, as up would have made it:
// its size and its FULL_OBJECT checksum of up's algorithm or, from a server without flexible
// checksums, its multipart ETag, recomputed from the file with up's part size.
func (r *run) alreadyStored(ctx context.Context, fh *os.File, f file, up *upload) (proof, bool) {
	out := r.headOf(ctx, f)
	if out == nil {
		return proof{}, false
	}
	ps := r.upPartSize(up, f)
	if have := up.Alg.pick(out.ChecksumCRC32C, out.ChecksumCRC64NVME); have != "" {
		if out.ChecksumType != types.ChecksumTypeFullObject {
			return proof{}, false
		}
		sum, err := up.Alg.of(fh, 0, f.Size)
		return proof{Sum: have, PartSize: ps}, err == nil && sum == have
	}
	tag := normETag(out.ETag)
	if !etag.Fits(f.Size, etag.Parts(tag), ps) {
		return proof{}, false
	}
	m := etag.NewMulti([]int64{ps})
	if _, err := io.Copy(m, io.NewSectionReader(fh, 0, f.Size)); err != nil {
		return proof{}, false
	}
	_, ok := etag.Match(m.Sum(nil), []int64{ps}, f.Size, tag)
	return proof{ETag: tag, PartSize: ps}, ok
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
