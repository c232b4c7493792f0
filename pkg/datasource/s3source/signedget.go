package s3source

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	smithyauth "github.com/aws/smithy-go/auth"
	"github.com/aws/smithy-go/encoding/httpbinding"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// Whole-object reads skip GetObject's per-call middleware stack. For a dataset of many small
// files the per-request work is what costs: building and running GetObject's stack (endpoint
// rules, retry loop, response deserialization, metrics) took about half of the client's CPU
// per 32 KiB object, as much as the HTTP exchange itself. The pieces that make the
// request right are still the SDK's: the bucket's endpoint comes from service/s3's endpoint
// resolver, once per source; the key is escaped by the same smithy-go function GetObject uses;
// the request is signed by the SDK's SigV4 signer, as GetObject signs it. Anything but a 200
// falls back to GetObject, which retries and names the error; a server that refuses these
// requests outright (a 4xx that GetObject then passes) gets GetObject from then on.

// emptySHA256 is the payload hash of a request without a body.
const emptySHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// signedGet sends whole-object GETs for one bucket.
type signedGet struct {
	base   url.URL // the bucket's endpoint: http://host/bucket or http://bucket.host
	region string  // signing region
	creds  aws.CredentialsProvider
	signer *v4.Signer
}

// newSignedGet resolves the bucket's endpoint as GetObject would. It returns nil where a
// request needs more than SigV4 for "s3" on that endpoint (S3 Express directory buckets, Object
// Lambda and multi-region access points) or the endpoint does not resolve: those sources use
// GetObject for every read.
func newSignedGet(ctx context.Context, bucket string, opts s3.Options) *signedGet {
	resolver := opts.EndpointResolverV2
	if resolver == nil {
		resolver = s3.NewDefaultEndpointResolverV2()
	}
	ep, err := resolver.ResolveEndpoint(ctx, s3.EndpointParameters{
		Bucket:         aws.String(bucket),
		Region:         aws.String(opts.Region),
		Endpoint:       opts.BaseEndpoint,
		ForcePathStyle: aws.Bool(opts.UsePathStyle),
		UseFIPS:        aws.Bool(false),
		UseDualStack:   aws.Bool(false),
		Accelerate:     aws.Bool(false),
	})
	if err != nil || ep.Properties.Get("backend") != nil {
		return nil
	}
	region := opts.Region
	if auth, ok := smithyauth.GetAuthOptions(&ep.Properties); ok && len(auth) > 0 {
		a := auth[0]
		if a.SchemeID != "sigv4" && a.SchemeID != smithyauth.SchemeIDSigV4 {
			return nil
		}
		if name, ok := smithyhttp.GetSigV4SigningName(&a.SignerProperties); ok && name != "s3" {
			return nil
		}
		if r, ok := smithyhttp.GetSigV4SigningRegion(&a.SignerProperties); ok && r != "" {
			region = r
		}
	}
	g := &signedGet{base: ep.URI, region: region}
	if _, anonymous := opts.Credentials.(aws.AnonymousCredentials); !anonymous {
		g.creds = opts.Credentials
		// S3 paths are escaped once, as the client's own signer does.
		g.signer = v4.NewSigner(func(so *v4.SignerOptions) { so.DisableURIPathEscaping = true })
	}
	return g
}

// request builds the signed GET of key, pinned to etag, asking for the object's checksums.
func (g *signedGet) request(ctx context.Context, key, etag string) (*http.Request, error) {
	return g.signed(ctx, http.MethodGet, key, etag)
}

// signed builds a signed request of method (GET, HEAD) for key, pinned to etag.
func (g *signedGet) signed(ctx context.Context, method, key, etag string) (*http.Request, error) {
	u := g.base
	u.RawPath = g.base.EscapedPath() + "/" + httpbinding.EscapePath(key, false)
	u.Path = g.base.Path + "/" + key
	req, err := http.NewRequestWithContext(ctx, method, "", nil)
	if err != nil {
		return nil, err
	}
	req.URL, req.Host = &u, u.Host
	if etag != "" {
		req.Header.Set("If-Match", `"`+etag+`"`)
	}
	req.Header.Set("X-Amz-Checksum-Mode", string(types.ChecksumModeEnabled))
	if g.signer == nil {
		return req, nil
	}
	creds, err := g.creds.Retrieve(ctx)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Amz-Content-Sha256", emptySHA256)
	return req, g.signer.SignHTTP(ctx, creds, req, emptySHA256, "s3", g.region, time.Now())
}

// openSigned tries the whole object with a signed GET. ok is false when the caller should use
// GetObject; status is the server's answer, 0 if there was none.
func (s *Source) openSigned(ctx context.Context, obj source.Object) (rc io.ReadCloser, status int, ok bool) {
	ctx, cancel := context.WithCancel(ctx)
	req, err := s.direct.request(ctx, s.cfg.Prefix+obj.Key, obj.ETag)
	if err != nil {
		cancel()
		return nil, 0, false
	}
	resp, err := s.http.Do(req)
	if err != nil {
		cancel() // GetObject retries and reports it
		return nil, 0, false
	}
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		cancel()
		return nil, resp.StatusCode, false
	}
	h := resp.Header // fullChecksum skips the empty values of absent headers
	sum := fullChecksum(types.ChecksumType(h.Get("X-Amz-Checksum-Type")),
		aws.String(h.Get("X-Amz-Checksum-Crc64nvme")), aws.String(h.Get("X-Amz-Checksum-Crc32c")),
		aws.String(h.Get("X-Amz-Checksum-Crc32")), aws.String(h.Get("X-Amz-Checksum-Sha256")),
		aws.String(h.Get("X-Amz-Checksum-Sha1")))
	return &body{rc: resp.Body, cancel: cancel, idle: s.cfg.IdleTimeout, key: obj.Key, sum: sum}, resp.StatusCode, true
}

// headSigned asks with a plain signed HEAD whether obj may be read as listed: true when the
// server said yes (200). Anything else is asked again through HeadObject, which retries and
// names the error. An access proof sends one per file: the SDK's stack per call cost as much
// as the exchange itself (see above).
func (s *Source) headSigned(ctx context.Context, obj source.Object) bool {
	if s.direct == nil || s.directOff.Load() {
		return false
	}
	req, err := s.direct.signed(ctx, http.MethodHead, s.cfg.Prefix+obj.Key, obj.ETag)
	if err != nil {
		return false
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// fellBack records how GetObject did after a signed GET of the same object was answered
// status: when the server refuses what GetObject is granted (a gateway that wants something
// GetObject adds), the source stops sending signed GETs.
func (s *Source) fellBack(ctx context.Context, status int, getErr error) {
	if getErr != nil || status < 400 || status >= 500 || status == http.StatusNotFound ||
		status == http.StatusPreconditionFailed {
		return
	}
	if s.directOff.CompareAndSwap(false, true) {
		klog.FromContext(ctx).Info("S3 server refused a plain signed GET that GetObject passed; using GetObject for every read",
			"dataset", s.where(), "status", status)
	}
}
