package streamfs

import (
	"context"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"strconv"

	"github.com/minio/crc64nvme"

	"github.com/cistern-csi/cistern/pkg/datasource/etag"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// Fetcher is where the bytes the cache does not hold yet come from: ranged reads pinned to the
// listed version, and what each range can be checked against.
type Fetcher interface {
	// Layout says how obj's bytes are checked: in parts that carry their own checksum, or only
	// as a whole.
	Layout(ctx context.Context, obj source.Object) (Layout, error)
	// Open reads [off, off+n) of obj as listed (pinned to its ETag or version).
	Open(ctx context.Context, obj source.Object, off, n int64) (io.ReadCloser, error)
}

// Layout is how an object's bytes are verified.
type Layout struct {
	// Parts, when set, cover the object in order, each with its own checksum: a read fetches
	// and checks only the parts it touches.
	Parts []source.Part
	// PartSizes are the part sizes a multipart object's ETag is checked under when its parts
	// have no checksum of their own: the one the server reports, or, when it reports none
	// (Inferred), those likely from the object's size and part count (package etag). The whole
	// object is read and checked against its ETag, the MD5 of the parts' MD5s.
	PartSizes []int64
	Inferred  bool
}

// SourceFetcher fetches from a dataset source: parts with checksums where the source reports
// them (source.Parter), otherwise the whole object, checked as the staging engine checks it.
type SourceFetcher struct{ Source source.Source }

// Layout asks the source for per-part checksums, then for the part size of a multipart object.
func (s SourceFetcher) Layout(ctx context.Context, obj source.Object) (Layout, error) {
	if p, ok := s.Source.(source.Parter); ok {
		parts, err := p.Parts(ctx, obj)
		if err != nil {
			return Layout{}, err
		}
		if len(parts) > 0 {
			return Layout{Parts: parts}, nil
		}
	}
	if p, ok := s.Source.(source.Planner); ok && etag.Parts(obj.ETag) > 0 {
		plan, err := p.Plan(ctx, obj)
		if err != nil {
			return Layout{}, err
		}
		sizes, inferred := etag.PartSizes(obj.Size, obj.ETag, plan.PartSize, plan.PartSizeHint)
		return Layout{PartSizes: sizes, Inferred: inferred}, nil
	}
	return Layout{}, nil
}

// Open reads from the source.
func (s SourceFetcher) Open(ctx context.Context, obj source.Object, off, n int64) (io.ReadCloser, error) {
	return s.Source.Open(ctx, obj, off, n)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// newHash returns the hash of an S3 checksum algorithm, or nil for one not known here.
func newHash(algorithm string) hash.Hash {
	switch algorithm {
	case "CRC32":
		return crc32.NewIEEE()
	case "CRC32C":
		return crc32.New(castagnoli)
	case "CRC64NVME":
		return crc64nvme.New()
	case "SHA1":
		return sha1.New()
	case "SHA256":
		return sha256.New()
	}
	return nil
}

// checker verifies bytes as they stream past; check reports whether they were the right ones.
type checker interface {
	io.Writer
	check() error
}

// sumChecker compares one S3 checksum.
type sumChecker struct {
	hash.Hash
	want source.Checksum
	what string
}

func (c *sumChecker) check() error {
	if got := base64.StdEncoding.EncodeToString(c.Sum(nil)); got != c.want.Value {
		return source.Errorf(source.Corrupt, "%s: %s %s does not match %s", c.what, c.want.Algorithm, got, c.want.Value)
	}
	return nil
}

// partsChecker computes a multipart ETag, the MD5 of the parts' MD5s, under each part size the
// object may have been uploaded with; inferred says they are not the server's.
type partsChecker struct {
	*etag.Multi
	sizes      []int64
	size       int64
	inferred   bool
	etag, what string
}

func (c *partsChecker) check() error {
	if _, ok := etag.Match(c.Sum(nil), c.sizes, c.size, c.etag); ok {
		return nil
	}
	if c.inferred {
		return source.Errorf(source.Unverifiable,
			"%s: the server reports no checksum and no part size, and ETag %s matches under none of the likely part sizes %v (a byte is wrong, or the parts were of another size)",
			c.what, c.etag, c.sizes)
	}
	return source.Errorf(source.Corrupt, "%s: parts' MD5s do not match ETag %s", c.what, c.etag)
}

// uncheckable is the check of an S3 object nothing checks: always unverifiable.
type uncheckable struct{ what, etag string }

func (uncheckable) Write(p []byte) (int, error) { return len(p), nil }
func (c uncheckable) check() error {
	return source.Errorf(source.Unverifiable, "%s: the server reports no checksum and no part size, and ETag %q checks nothing", c.what, c.etag)
}

// sizeOnly is the check of sources with nothing finer than a size (NFS, node-local): the
// length is checked by the caller, and the source's own Verify says whether the entry changed.
type sizeOnly struct{}

func (sizeOnly) Write(p []byte) (int, error) { return len(p), nil }
func (sizeOnly) check() error                { return nil }

// wholeChecker picks what a whole-object read is checked against, as the staging engine does:
// the full-object checksum the response carries, the MD5 ETag of a single-part object, or the
// parts' MD5s of a multipart one. An S3 object none of these checks is unverifiable.
func wholeChecker(obj source.Object, l Layout, rc io.Reader) checker {
	what := strconv.Quote(obj.Key)
	if c, ok := rc.(source.Checksummed); ok {
		if sum := c.Checksum(); sum.Algorithm != "" {
			if h := newHash(sum.Algorithm); h != nil {
				return &sumChecker{Hash: h, want: sum, what: what}
			}
		}
	}
	switch {
	case etag.IsMD5(obj.ETag):
		return &etagChecker{Hash: md5.New(), etag: obj.ETag, what: what}
	case etag.Parts(obj.ETag) > 0 && len(l.PartSizes) > 0:
		return &partsChecker{Multi: etag.NewMulti(l.PartSizes), sizes: l.PartSizes, size: obj.Size,
			inferred: l.Inferred, etag: obj.ETag, what: what}
	case obj.ETag != "": // other sources have no ETag
		return uncheckable{what: what, etag: obj.ETag}
	}
	return sizeOnly{}
}

// etagChecker compares the MD5 ETag of a single-part object.
type etagChecker struct {
	hash.Hash
	etag, what string
}

func (c *etagChecker) check() error {
	if got := hex.EncodeToString(c.Sum(nil)); got != c.etag {
		return source.Errorf(source.Corrupt, "%s: MD5 %s does not match ETag %s", c.what, got, c.etag)
	}
	return nil
}

// partChecker checks one part against its own checksum.
func partChecker(obj source.Object, p source.Part) (checker, error) {
	h := newHash(p.Checksum.Algorithm)
	if h == nil {
		return nil, source.Errorf(source.Corrupt, "%q: part at %d has no checksum this node can check (%q)",
			obj.Key, p.Off, p.Checksum.Algorithm)
	}
	return &sumChecker{Hash: h, want: p.Checksum, what: fmt.Sprintf("%q bytes %d-%d", obj.Key, p.Off, p.Off+p.N-1)}, nil
}
