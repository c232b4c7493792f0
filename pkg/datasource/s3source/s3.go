// Package s3source reads datasets from S3 and S3-compatible servers with aws-sdk-go-v2: custom
// endpoints, path-style addressing, paginated listing, ranged reads pinned to the listed ETag,
// and whole-object reads as plain GETs the SDK signs (signedget.go).
package s3source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"golang.org/x/sync/errgroup"

	"github.com/cistern-csi/cistern/pkg/datasource/egress"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// Config describes one S3 dataset.
type Config struct {
	Bucket    string
	Prefix    string // "" or ending in "/"
	Endpoint  string // empty: AWS
	Region    string // empty: us-east-1
	PathStyle bool

	AccessKeyID, SecretAccessKey, SessionToken string
	// WebIdentity, when set, is where the keys come from instead (webidentity.go).
	WebIdentity *WebIdentity

	// MaxConns bounds idle connections kept to the server (the engine bounds concurrency).
	MaxConns int
	// IdleTimeout aborts a read that made no progress for this long (slow or stuck server).
	IdleTimeout time.Duration
	// Egress is what the client may connect to; the zero value refuses link-local and cloud
	// metadata addresses only.
	Egress egress.Policy
	// TLS is how the endpoint is trusted, and whether a plain-HTTP one off the node is allowed.
	TLS TLS
	// MaxListed bounds the keys and common prefixes one listing may go through, whether the
	// engine's filters keep them or not (0: unbounded); past it the listing fails TooLarge.
	MaxListed int64
}

// Source is an S3 dataset source.
type Source struct {
	cfg    Config
	client *s3.Client
	http   *http.Client
	// direct sends whole-object GETs (signedget.go); nil where only GetObject will do.
	direct *signedGet
	// directOff is set once the server has refused a signed GET that GetObject then passed.
	directOff atomic.Bool
}

// New builds the client. Credentials come only from cfg: no environment, profile or instance
// metadata lookups, so a node's own identity is never lent to a volume.
func New(cfg Config) (*Source, error) {
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 64
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = time.Minute
	}
	if err := cfg.TLS.checkEndpoint(cfg.Endpoint); err != nil {
		return nil, err
	}
	tr := &http.Transport{
		TLSClientConfig:       cfg.TLS.clientConfig(),
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           cfg.Egress.DialContext(net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}),
		MaxIdleConns:          cfg.MaxConns,
		MaxIdleConnsPerHost:   cfg.MaxConns,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		ExpectContinueTimeout: time.Second,
		// Bodies are binary: gzip would cost CPU and defeat ranged reads.
		DisableCompression: true,
	}
	// Redirects are never followed: a server could send the node to an internal URL and have
	// its answer staged into the volume. S3 does not redirect a correctly addressed request.
	hc := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	var creds aws.CredentialsProvider = aws.AnonymousCredentials{}
	switch {
	case cfg.WebIdentity != nil:
		creds = cfg.WebIdentity.credentials(cfg.Region, hc)
	case cfg.AccessKeyID != "":
		creds = credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, cfg.SecretAccessKey, cfg.SessionToken)
	}
	opts := s3.Options{
		Region:       cfg.Region,
		Credentials:  creds,
		UsePathStyle: cfg.PathStyle,
		HTTPClient:   hc,
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts = 6
			o.MaxBackoff = 10 * time.Second
			// Throttling is the server asking us to slow down, not a reason to give up.
			o.RateLimiter = noRateLimit{}
			// A connection the egress policy refused is refused again on retry.
			o.Retryables = append([]retry.IsErrorRetryable{retry.IsErrorRetryableFunc(notEgressDenied)}, o.Retryables...)
		}),
		// The engine checks checksums itself (see Open).
		ResponseChecksumValidation:                aws.ResponseChecksumValidationWhenRequired,
		DisableLogOutputChecksumValidationSkipped: true,
	}
	if cfg.Endpoint != "" {
		opts.BaseEndpoint = aws.String(cfg.Endpoint)
	}
	return &Source{cfg: cfg, client: s3.New(opts), http: hc, direct: newSignedGet(context.Background(), cfg.Bucket, opts)}, nil
}

func notEgressDenied(err error) aws.Ternary {
	var denied *egress.DeniedError
	if errors.As(err, &denied) {
		return aws.FalseTernary
	}
	return aws.UnknownTernary
}

type noRateLimit struct{}

func (noRateLimit) GetToken(context.Context, uint) (func() error, error) {
	return func() error { return nil }, nil
}
func (noRateLimit) AddTokens(uint) error { return nil }

func (s *Source) where() string { return fmt.Sprintf("s3://%s/%s", s.cfg.Bucket, s.cfg.Prefix) }

// Listing: the first levels of the key tree are listed with a "/" delimiter, in parallel, until
// there are listWidth subtrees or listDepth levels; each subtree is then listed flat, side by
// side. A large dataset's listing takes a few rounds of parallel pages instead of one long
// sequence of pages, and a server that walks directories (a POSIX gateway) walks only a
// subtree per request.
const (
	listWidth = 16
	listDepth = 3
	// maxSubtrees bounds the sub-prefixes one level of the walk keeps: a server (or a bucket)
	// answering with millions of common prefixes would otherwise grow the walk's memory without
	// bound. Sub-prefixes beyond it are listed flat at once instead.
	maxSubtrees = 64 * listWidth
)

// List lists every key under the prefix. fn is called from one goroutine at a time.
func (s *Source) List(ctx context.Context, fn func(source.Object) error) error {
	return s.ListCounting(ctx, fn, nil)
}

// ListCounting is List, calling seen (when set) for every key and common prefix listed
// (source.CountingLister).
func (s *Source) ListCounting(ctx context.Context, fn func(source.Object) error, seen func()) error {
	var (
		mu     sync.Mutex
		listed atomic.Int64
	)
	// count charges one key or common prefix to the listing's bound.
	count := func() error {
		if seen != nil {
			seen()
		}
		if n := listed.Add(1); s.cfg.MaxListed > 0 && n > s.cfg.MaxListed {
			return source.Errorf(source.TooLarge, "it has more than %d entries, counting every key and common prefix listed, the most a dataset may have on this node", s.cfg.MaxListed)
		}
		return nil
	}
	emit := func(o source.Object) error {
		if err := count(); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		return fn(o)
	}
	level := []string{s.cfg.Prefix}
	for depth := 0; depth < listDepth && len(level) < listWidth; depth++ {
		var next []string
		err := s.each(ctx, level, func(p string) error {
			return s.listPages(ctx, p, "/", emit, func(sub string) error {
				if err := count(); err != nil {
					return err
				}
				mu.Lock()
				keep := len(next) < maxSubtrees
				if keep {
					next = append(next, sub)
				}
				mu.Unlock()
				if keep {
					return nil
				}
				return s.listPages(ctx, sub, "", emit, nil)
			})
		})
		if err != nil || len(next) == 0 {
			return err
		}
		level = next
	}
	return s.each(ctx, level, func(p string) error { return s.listPages(ctx, p, "", emit, nil) })
}

// each runs list for every prefix, listWidth at a time, and returns the first error.
func (s *Source) each(ctx context.Context, prefixes []string, list func(string) error) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(listWidth)
	for _, p := range prefixes {
		g.Go(func() error {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return list(p)
		})
	}
	return g.Wait()
}

// listPages pages through the keys under prefix; with a delimiter, the sub-prefixes go to sub.
func (s *Source) listPages(ctx context.Context, prefix, delimiter string, emit func(source.Object) error, sub func(string) error) error {
	in := &s3.ListObjectsV2Input{Bucket: aws.String(s.cfg.Bucket), Prefix: aws.String(prefix)}
	if delimiter != "" {
		in.Delimiter = aws.String(delimiter)
	}
	p := s3.NewListObjectsV2Paginator(s.client, in)
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return classify(err, "listing %s", s.where())
		}
		for _, cp := range page.CommonPrefixes {
			if err := sub(aws.ToString(cp.Prefix)); err != nil {
				return err
			}
		}
		for _, o := range page.Contents {
			key := aws.ToString(o.Key)
			rel, under := strings.CutPrefix(key, s.cfg.Prefix)
			if !under {
				// Asked for prefix's keys only: a server that lists others is not to be followed.
				return source.Errorf(source.Corrupt, "listing %s: the server listed %q, outside the prefix", s.where(), key)
			}
			if rel == "" {
				continue // the prefix's own folder marker
			}
			if strings.HasSuffix(rel, "/") && aws.ToInt64(o.Size) == 0 {
				if r := strings.TrimSuffix(rel, "/"); r != "" {
					if err := source.ValidateKey(r); err != nil {
						return err
					}
					if err := emit(source.Object{Key: r, Type: source.Dir}); err != nil {
						return err
					}
				}
				continue
			}
			if err := source.ValidateKey(rel); err != nil {
				return err
			}
			if err := emit(source.Object{
				Key:  rel,
				Type: source.File,
				Size: aws.ToInt64(o.Size),
				ETag: strings.Trim(aws.ToString(o.ETag), `"`),
			}); err != nil {
				return err
			}
		}
	}
	return nil
}

// Open reads [off, off+n) of the object, pinned to the listed ETag. A full read asks for the
// object's checksum headers; the returned reader reports a full-object checksum, if the object has
// one, for the engine to check as the bytes stream (source.Checksummed). The SDK does not check it
// too: one pass over the bytes is enough, and the engine's CRCs are the faster ones. A full read
// is tried as a plain signed GET first (signedget.go).
func (s *Source) Open(ctx context.Context, obj source.Object, off, n int64) (io.ReadCloser, error) {
	full := off == 0 && n == obj.Size
	status := 0 // the signed GET's answer, when GetObject comes after one
	if full && s.direct != nil && !s.directOff.Load() {
		rc, st, ok := s.openSigned(ctx, obj)
		if ok {
			return rc, nil
		}
		status = st
	}
	in := &s3.GetObjectInput{
		Bucket: aws.String(s.cfg.Bucket),
		Key:    aws.String(s.cfg.Prefix + obj.Key),
	}
	if obj.ETag != "" {
		in.IfMatch = aws.String(`"` + obj.ETag + `"`)
	}
	var opts []func(*s3.Options)
	if full {
		opts = append(opts, checksumHeaders)
	} else {
		in.Range = aws.String(fmt.Sprintf("bytes=%d-%d", off, off+n-1))
	}
	ctx, cancel := context.WithCancel(ctx)
	out, err := s.client.GetObject(ctx, in, opts...)
	if status != 0 {
		s.fellBack(ctx, status, err)
	}
	if err != nil {
		cancel()
		return nil, classify(err, "reading %s%s", s.where(), obj.Key)
	}
	b := &body{rc: out.Body, cancel: cancel, idle: s.cfg.IdleTimeout, key: obj.Key}
	if full {
		b.sum = fullChecksum(out.ChecksumType, out.ChecksumCRC64NVME, out.ChecksumCRC32C, out.ChecksumCRC32,
			out.ChecksumSHA256, out.ChecksumSHA1)
	}
	return b, nil
}

// checksumHeaders asks for the object's checksums (x-amz-checksum-mode) without setting the
// input's ChecksumMode, which would make the SDK validate them as well.
func checksumHeaders(o *s3.Options) {
	o.APIOptions = append(o.APIOptions, smithyhttp.AddHeaderValue("X-Amz-Checksum-Mode", "ENABLED"))
}

// fullChecksum picks the checksum to check among those a response carries, cheapest first. A
// composite checksum (a checksum of part checksums) says nothing a full read can check.
func fullChecksum(typ types.ChecksumType, crc64nvme, crc32c, crc32, sha256, sha1 *string) source.Checksum {
	if typ == types.ChecksumTypeComposite {
		return source.Checksum{}
	}
	for _, c := range []struct {
		algo  string
		value *string
	}{{"CRC32C", crc32c}, {"CRC64NVME", crc64nvme}, {"CRC32", crc32}, {"SHA256", sha256}, {"SHA1", sha1}} {
		if v := aws.ToString(c.value); v != "" && !strings.Contains(v, "-") {
			return source.Checksum{Algorithm: c.algo, Value: v}
		}
	}
	return source.Checksum{}
}

// body cancels the request when no byte arrives for idle: a stalled server becomes a retryable
// error instead of a hung worker.
type body struct {
	rc     io.ReadCloser
	cancel context.CancelFunc
	idle   time.Duration
	timer  *time.Timer
	sum    source.Checksum
	key    string
}

func (b *body) Read(p []byte) (int, error) {
	if b.timer == nil {
		b.timer = time.AfterFunc(b.idle, b.cancel)
	} else {
		b.timer.Reset(b.idle)
	}
	n, err := b.rc.Read(p)
	if err != nil && err != io.EOF {
		err = classify(err, "reading %s", b.key)
	}
	return n, err
}

func (b *body) Close() error {
	if b.timer != nil {
		b.timer.Stop()
	}
	err := b.rc.Close()
	b.cancel()
	return err
}

// Checksum is the object's full-object checksum, when this is a full read of an object that has
// one.
func (b *body) Checksum() source.Checksum { return b.sum }

// Verify has nothing to add: reads are pinned with If-Match.
func (s *Source) Verify(context.Context, source.Object) error { return nil }

// Plan asks the server (HEAD) whether the object carries a full-object checksum; if not, and it
// is multipart, it returns the part size so reads can align on parts. The part size its uploader
// recorded (source.PartSizeMetadata) comes with it, for servers that report none.
func (s *Source) Plan(ctx context.Context, obj source.Object) (source.Plan, error) {
	in := &s3.HeadObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(s.cfg.Prefix + obj.Key)}
	// A server that lists no ETag (versitygw for files put straight into its directory) would
	// refuse If-Match: "" as a failed precondition; such an object is pinned by nothing here,
	// as in Open and CheckRead.
	if obj.ETag != "" {
		in.IfMatch = aws.String(`"` + obj.ETag + `"`)
	}
	out, err := s.client.HeadObject(ctx, in, checksumHeaders)
	if err != nil {
		return source.Plan{}, classify(err, "reading attributes of %s%s", s.where(), obj.Key)
	}
	sum := fullChecksum(out.ChecksumType, out.ChecksumCRC64NVME, out.ChecksumCRC32C, out.ChecksumCRC32,
		out.ChecksumSHA256, out.ChecksumSHA1)
	plan := source.Plan{Checksum: sum}
	if hint, err := strconv.ParseInt(out.Metadata[source.PartSizeMetadata], 10, 64); err == nil && hint > 0 {
		plan.PartSizeHint = hint
	}
	if sum.Algorithm != "" {
		return plan, nil
	}
	plan.PartSize, err = s.PartSize(ctx, obj)
	return plan, err
}

// PartSize asks the server (HEAD of part 1, pinned to the listed ETag) the part size of a
// multipart object; 0 for one uploaded whole.
func (s *Source) PartSize(ctx context.Context, obj source.Object) (int64, error) {
	if !strings.Contains(obj.ETag, "-") {
		return 0, nil
	}
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{
		Bucket:     aws.String(s.cfg.Bucket),
		Key:        aws.String(s.cfg.Prefix + obj.Key),
		IfMatch:    aws.String(`"` + obj.ETag + `"`),
		PartNumber: aws.Int32(1),
	})
	if err != nil {
		return 0, classify(err, "reading part size of %s%s", s.where(), obj.Key)
	}
	if aws.ToInt32(out.PartsCount) <= 1 {
		return 0, nil
	}
	return aws.ToInt64(out.ContentLength), nil
}

// CheckRead asks (HEAD, pinned to the listed ETag) whether the credentials may read obj. S3
// authorizes HEAD as GetObject, so the answer is the read right, per object, that a bucket
// policy or an object ACL grants; no data is transferred.
func (s *Source) CheckRead(ctx context.Context, obj source.Object) error {
	if s.headSigned(ctx, obj) {
		return nil
	}
	in := &s3.HeadObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(s.cfg.Prefix + obj.Key)}
	if obj.ETag != "" {
		in.IfMatch = aws.String(`"` + obj.ETag + `"`)
	}
	_, err := s.client.HeadObject(ctx, in)
	return classify(err, "reading %s%s", s.where(), obj.Key)
}

// Close drops idle connections.
func (s *Source) Close() error {
	s.http.CloseIdleConnections()
	return nil
}

// classify maps SDK and network errors to kinds: authorization and missing buckets or keys fail
// fast; server errors, throttling, resets and timeouts are retryable.
func classify(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	msg := fmt.Sprintf(format, args...)
	var denied *egress.DeniedError
	if errors.As(err, &denied) {
		return source.Wrap(source.Denied, denied, "%s", msg)
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled",
			"InvalidToken", "ExpiredToken", "AccountProblem", "Forbidden",
			// The STS refusing a web identity (webidentity.go).
			"InvalidIdentityToken", "ExpiredTokenException", "IDPRejectedClaim":
			return source.Wrap(source.Denied, errors.New(api.ErrorCode()), "%s: access denied", msg)
		case "NoSuchBucket", "NoSuchKey", "NotFound":
			return source.Wrap(source.NotFound, errors.New(api.ErrorCode()), "%s: not found", msg)
		case "PreconditionFailed":
			return source.Wrap(source.Changed, errors.New(api.ErrorCode()), "%s: object changed since the dataset was listed", msg)
		case "InvalidBucketName", "InvalidArgument", "InvalidRange", "PermanentRedirect", "AuthorizationHeaderMalformed":
			return source.Wrap(source.Invalid, errors.New(api.ErrorCode()), "%s", msg)
		}
	}
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		switch code := re.HTTPStatusCode(); {
		case code == http.StatusForbidden || code == http.StatusUnauthorized:
			return source.Wrap(source.Denied, fmt.Errorf("HTTP %d", code), "%s: access denied", msg)
		case code == http.StatusNotFound:
			return source.Wrap(source.NotFound, fmt.Errorf("HTTP %d", code), "%s: not found", msg)
		case code == http.StatusPreconditionFailed:
			return source.Wrap(source.Changed, fmt.Errorf("HTTP %d", code), "%s: object changed since the dataset was listed", msg)
		case code == http.StatusBadRequest:
			return source.Wrap(source.Invalid, fmt.Errorf("HTTP %d", code), "%s", msg)
		case code >= 300 && code < 400:
			return source.Wrap(source.Invalid, fmt.Errorf("HTTP %d", code), "%s: the server answered with a redirect, which is not followed", msg)
		}
	}
	if e, ok := untrusted(err, msg); ok {
		return e
	}
	var dns *net.DNSError
	if errors.As(err, &dns) && dns.IsNotFound {
		return source.Wrap(source.Invalid, fmt.Errorf("unknown host %s", dns.Name), "%s: bad endpoint", msg)
	}
	var ae *net.AddrError
	if errors.As(err, &ae) {
		return source.Wrap(source.Invalid, err, "%s: bad endpoint", msg)
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		// A restarting server refuses too; the engine retries a few times before giving up.
		return source.Wrap(source.Retryable, errors.New("connection refused"), "%s", msg)
	}
	return source.Wrap(source.Retryable, err, "%s", msg)
}
