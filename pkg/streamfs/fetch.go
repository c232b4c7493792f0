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
	"regexp"
	"strconv"

	"github.com/minio/crc64nvme"

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
	// PartSize is the size of a multipart object's parts when they have no checksum of their
	// own: the whole object is read and checked against its ETag, the MD5 of the parts' MD5s.
	PartSize int64
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
	if p, ok := s.Source.(source.Planner); ok && multipartETag.MatchString(obj.ETag) {
		plan, err := p.Plan(ctx, obj)
		if err != nil {
			return Layout{}, err
		}
		return Layout{PartSize: plan.PartSize}, nil
	}
	return Layout{}, nil
}

// Open reads from the source.
func (s SourceFetcher) Open(ctx context.Context, obj source.Object, off, n int64) (io.ReadCloser, error) {
	return s.Source.Open(ctx, obj, off, n)
}

var (
	md5ETag       = regexp.MustCompile(`^[0-9a-f]{32}$`)
	multipartETag = regexp.MustCompile(`^[0-9a-f]{32}-([0-9]+)$`)
	castagnoli    = crc32.MakeTable(crc32.Castagnoli)
)

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

// partsChecker computes a multipart ETag: the MD5 of the parts' MD5s, then "-<parts>".
type partsChecker struct {
	partSize, inPart int64
	part             hash.Hash
	sums             []byte
	parts            int
	etag, what       string
}

func (c *partsChecker) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(int64(len(p)), c.partSize-c.inPart)
		c.part.Write(p[:k])
		p, c.inPart = p[k:], c.inPart+k
		if c.inPart == c.partSize {
			c.endPart()
		}
	}
	return n, nil
}

func (c *partsChecker) endPart() {
	c.sums, c.parts, c.inPart = c.part.Sum(c.sums), c.parts+1, 0
	c.part.Reset()
}

func (c *partsChecker) check() error {
	if c.inPart > 0 {
		c.endPart()
	}
	sum := md5.Sum(c.sums)
	if got := hex.EncodeToString(sum[:]) + "-" + strconv.Itoa(c.parts); got != c.etag {
		return source.Errorf(source.Corrupt, "%s: parts' MD5 %s does not match ETag %s", c.what, got, c.etag)
	}
	return nil
}

// sizeOnly is the check of sources with nothing finer than a size (NFS, node-local): the
// length is checked by the caller, and the source's own Verify says whether the entry changed.
type sizeOnly struct{}

func (sizeOnly) Write(p []byte) (int, error) { return len(p), nil }
func (sizeOnly) check() error                { return nil }

// wholeChecker picks what a whole-object read is checked against, as the staging engine does:
// the full-object checksum the response carries, the MD5 ETag of a single-part object, or the
// parts' MD5s of a multipart one.
func wholeChecker(obj source.Object, l Layout, rc io.Reader) checker {
	what := strconv.Quote(obj.Key)
	if c, ok := rc.(source.Checksummed); ok {
		if sum := c.Checksum(); sum.Algorithm != "" {
			if h := newHash(sum.Algorithm); h != nil {
				return &sumChecker{Hash: h, want: sum, what: what}
			}
		}
	}
	if md5ETag.MatchString(obj.ETag) {
		return &etagChecker{Hash: md5.New(), etag: obj.ETag, what: what}
	}
	if multipartETag.MatchString(obj.ETag) && l.PartSize > 0 {
		return &partsChecker{partSize: l.PartSize, part: md5.New(), etag: obj.ETag, what: what}
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
