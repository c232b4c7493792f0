package s3source

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"hash/crc32"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// sdkRequest tells GetObject's requests from the plain signed GETs: only the SDK's stack sends
// an invocation ID.
func sdkRequest(r *http.Request) bool { return r.Header.Get("Amz-Sdk-Invocation-Id") != "" }

// recorder counts object GETs by kind, and can refuse the plain ones.
type recorder struct {
	mu          sync.Mutex
	plain, sdk  int
	refusePlain int // HTTP status for plain GETs; 0: forward
}

func (r *recorder) choose(req *http.Request, _ int64) testpeers.Fault {
	if req.Method != http.MethodGet || req.URL.Query().Has("list-type") {
		return testpeers.None
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if sdkRequest(req) {
		r.sdk++
		return testpeers.None
	}
	r.plain++
	if r.refusePlain != 0 {
		return testpeers.Fault{Status: r.refusePlain, Code: "AccessDenied", ResetAfter: -1}
	}
	return testpeers.None
}

func (r *recorder) counts() (plain, sdk int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.plain, r.sdk
}

type fixture struct {
	s     *testpeers.S3
	rec   *recorder
	proxy *testpeers.Proxy
}

func start(t *testing.T) *fixture {
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	rec := &recorder{}
	return &fixture{s: s, rec: rec, proxy: testpeers.StartProxy(t, s.Endpoint, rec.choose)}
}

func (f *fixture) source(t *testing.T, prefix string) *Source {
	src, err := New(Config{Bucket: "data", Prefix: prefix, Endpoint: f.proxy.URL, PathStyle: true,
		AccessKeyID: f.s.AccessKey, SecretAccessKey: f.s.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	if src.direct == nil {
		t.Fatal("no signed GETs for a path-style custom endpoint")
	}
	return src
}

// putCRC32C uploads data with a CRC32C checksum and returns it as S3 encodes it.
func (f *fixture) putCRC32C(t *testing.T, key string, data []byte) string {
	t.Helper()
	if _, err := f.s.Client.PutObject(context.Background(), &s3.PutObjectInput{
		Bucket: aws.String("data"), Key: aws.String(key), Body: bytes.NewReader(data),
		ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c,
	}); err != nil {
		t.Fatalf("put %q: %v", key, err)
	}
	sum := crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli))
	return base64.StdEncoding.EncodeToString([]byte{byte(sum >> 24), byte(sum >> 16), byte(sum >> 8), byte(sum)})
}

func list(t *testing.T, src *Source) map[string]source.Object {
	t.Helper()
	objs := map[string]source.Object{}
	if err := src.List(context.Background(), func(o source.Object) error {
		objs[o.Key] = o
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return objs
}

func read(t *testing.T, src *Source, o source.Object, off, n int64) ([]byte, source.Checksum) {
	t.Helper()
	rc, err := src.Open(context.Background(), o, off, n)
	if err != nil {
		t.Fatalf("open %q: %v", o.Key, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %q: %v", o.Key, err)
	}
	return b, rc.(source.Checksummed).Checksum()
}

// TestWholeReadsAreSignedGETs reads objects whose keys need escaping, under a prefix that needs
// it too, through plain signed GETs: the server must accept each signature, return the bytes
// and the checksum, and GetObject must not be needed. Ranged reads stay with GetObject.
func TestWholeReadsAreSignedGETs(t *testing.T) {
	f := start(t)
	prefix := "set a+b/"
	keys := []string{
		"plain.bin",
		"space and+plus=equals.bin",
		"ünïcödé/日本語.txt",
		"reserved/!$&'()*,;:@[]~.bin",
		"query?and#hash%25percent.bin",
		"dot./.hidden",
	}
	want := map[string][]byte{}
	sums := map[string]string{}
	for i, k := range keys {
		data := make([]byte, 1000+i*4097)
		rand.Read(data)
		want[k] = data
		sums[k] = f.putCRC32C(t, prefix+k, data)
	}
	src := f.source(t, prefix)
	objs := list(t, src)
	if len(objs) != len(keys) {
		t.Fatalf("listed %d objects, want %d: %v", len(objs), len(keys), objs)
	}
	for _, k := range keys {
		o, ok := objs[k]
		if !ok {
			t.Fatalf("%q not listed", k)
		}
		got, sum := read(t, src, o, 0, o.Size)
		if !bytes.Equal(got, want[k]) {
			t.Errorf("%q: %d bytes differ from the %d uploaded", k, len(got), len(want[k]))
		}
		if sum.Algorithm != "CRC32C" || sum.Value != sums[k] {
			t.Errorf("%q: checksum %+v, want CRC32C %s", k, sum, sums[k])
		}
	}
	if plain, sdk := f.rec.counts(); plain != len(keys) || sdk != 0 {
		t.Fatalf("whole reads: %d plain GETs and %d GetObject calls, want %d and 0", plain, sdk, len(keys))
	}

	o := objs[keys[1]]
	got, sum := read(t, src, o, 10, 100)
	if !bytes.Equal(got, want[keys[1]][10:110]) || sum.Algorithm != "" {
		t.Errorf("ranged read: wrong bytes or a checksum (%+v) for a part of the object", sum)
	}
	if plain, sdk := f.rec.counts(); plain != len(keys) || sdk != 1 {
		t.Errorf("after a ranged read: %d plain GETs and %d GetObject calls, want %d and 1", plain, sdk, len(keys))
	}
}

// TestSignedGETFallsBack covers the answers other than 200: a server that refuses plain
// signed GETs (a gateway wanting something only GetObject sends) is given GetObject from then
// on; a transient error is GetObject's to retry without giving up signed GETs; an object
// changed since listing is reported as such.
func TestSignedGETFallsBack(t *testing.T) {
	for _, c := range []struct {
		name       string
		status     int
		refuseOnce bool // answer status to the first plain GET only
		plain, sdk int  // GETs of each kind for two objects
	}{
		{"refused: GetObject from then on", http.StatusForbidden, false, 1, 2},
		{"transient: signed GETs go on", http.StatusServiceUnavailable, true, 2, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := start(t)
			f.s.Put(t, "data", "a", []byte("first"))
			f.s.Put(t, "data", "b", []byte("second"))
			f.rec.refusePlain = c.status
			src := f.source(t, "")
			objs := list(t, src)
			for _, k := range []string{"a", "b"} {
				if got, _ := read(t, src, objs[k], 0, objs[k].Size); string(got) == "" {
					t.Fatalf("%s: empty read", k)
				}
				if c.refuseOnce {
					f.rec.mu.Lock()
					f.rec.refusePlain = 0
					f.rec.mu.Unlock()
				}
			}
			if plain, sdk := f.rec.counts(); plain != c.plain || sdk != c.sdk {
				t.Fatalf("%d plain GETs and %d GetObject calls, want %d and %d", plain, sdk, c.plain, c.sdk)
			}
		})
	}
	t.Run("failure case - object changed since listing", func(t *testing.T) {
		f := start(t)
		f.s.Put(t, "data", "a", []byte("first"))
		src := f.source(t, "")
		objs := list(t, src)
		f.s.Put(t, "data", "a", []byte("changed"))
		_, err := src.Open(context.Background(), objs["a"], 0, objs["a"].Size)
		if source.KindOf(err) != source.Changed || !strings.Contains(err.Error(), "changed since the dataset was listed") {
			t.Fatalf("got %v, want a Changed error", err)
		}
		if src.directOff.Load() {
			t.Fatal("a changed object turned signed GETs off")
		}
	})
}

// TestSignedGETRequest checks the request itself where no server can: the bucket's endpoint
// as service/s3 resolves it, a session token signed along, and the buckets whose requests
// need more than SigV4 on one endpoint (S3 Express) left to GetObject.
func TestSignedGETRequest(t *testing.T) {
	options := func(endpoint string, pathStyle bool) s3.Options {
		opts := s3.Options{Region: "eu-west-1", UsePathStyle: pathStyle,
			Credentials: credentials.NewStaticCredentialsProvider("AK", "SK", "TOKEN")}
		if endpoint != "" {
			opts.BaseEndpoint = aws.String(endpoint)
		}
		return opts
	}
	base := func(bucket, endpoint string, pathStyle bool) *signedGet {
		return newSignedGet(context.Background(), bucket, options(endpoint, pathStyle))
	}
	for _, c := range []struct {
		name, bucket, endpoint string
		pathStyle              bool
		want                   string
	}{
		{"path style", "data", "http://127.0.0.1:9000", true, "http://127.0.0.1:9000/data/k%20%2B.bin"},
		{"virtual host", "data", "https://storage.example.com", false, "https://data.storage.example.com/k%20%2B.bin"},
		{"AWS", "data", "", false, "https://data.s3.eu-west-1.amazonaws.com/k%20%2B.bin"},
		{"endpoint with a trailing slash", "data", "http://127.0.0.1:9000/", true, "http://127.0.0.1:9000/data/k%20%2B.bin"},
		{"endpoint with a path", "data", "http://127.0.0.1:9000/s3/", true, "http://127.0.0.1:9000/s3/data/k%20%2B.bin"},
		{"dotted bucket on a custom endpoint", "my.data", "http://10.0.0.1:9000", false, "http://10.0.0.1:9000/my.data/k%20%2B.bin"},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := base(c.bucket, c.endpoint, c.pathStyle)
			if g == nil {
				t.Fatal("no signed GETs")
			}
			req, err := g.request(context.Background(), "k +.bin", "abc")
			if err != nil {
				t.Fatal(err)
			}
			if got := req.URL.String(); got != c.want {
				t.Errorf("URL %s, want %s", got, c.want)
			}
			// The same URL as GetObject's, which the SDK shows through its presigner.
			sdk, err := s3.NewPresignClient(s3.New(options(c.endpoint, c.pathStyle))).PresignGetObject(context.Background(),
				&s3.GetObjectInput{Bucket: aws.String(c.bucket), Key: aws.String("k +.bin")})
			if err != nil {
				t.Fatal(err)
			}
			if u, _ := url.Parse(sdk.URL); u.Scheme+"://"+u.Host+u.EscapedPath() != req.URL.String() {
				t.Errorf("GetObject goes to %s://%s%s, the signed GET to %s", u.Scheme, u.Host, u.EscapedPath(), req.URL)
			}
			auth := req.Header.Get("Authorization")
			for _, want := range []string{"Credential=AK/", "/eu-west-1/s3/aws4_request", "if-match", "x-amz-checksum-mode", "x-amz-security-token"} {
				if !strings.Contains(auth, want) {
					t.Errorf("Authorization %q lacks %q", auth, want)
				}
			}
			if req.Header.Get("X-Amz-Security-Token") != "TOKEN" || req.Header.Get("If-Match") != `"abc"` {
				t.Errorf("headers %v", req.Header)
			}
		})
	}
	for name, bucket := range map[string]string{
		"S3 Express directory bucket": "data--euw1-az1--x-s3",
		"multi-region access point":   "arn:aws:s3::123456789012:accesspoint/mfzwi23gnjvgw.mrap",
		"Object Lambda access point":  "arn:aws:s3-object-lambda:eu-west-1:123456789012:accesspoint/banner",
	} {
		t.Run(name, func(t *testing.T) {
			if g := base(bucket, "", false); g != nil {
				t.Fatalf("signed GETs to %s", g.base.String())
			}
		})
	}
	t.Run("anonymous", func(t *testing.T) {
		g := newSignedGet(context.Background(), "data", s3.Options{Region: "us-east-1", UsePathStyle: true,
			BaseEndpoint: aws.String("http://127.0.0.1:9000"), Credentials: aws.AnonymousCredentials{}})
		req, err := g.request(context.Background(), "k", "")
		if err != nil {
			t.Fatal(err)
		}
		if req.Header.Get("Authorization") != "" || req.Header.Get("If-Match") != "" {
			t.Fatalf("anonymous request with headers %v", req.Header)
		}
	})
}

// TestAnonymousSignedGET reads a public bucket without credentials: the plain GET goes out
// unsigned, as GetObject's would.
func TestAnonymousSignedGET(t *testing.T) {
	f := start(t)
	f.s.Put(t, "data", "pub/a", []byte("public bytes"))
	policy := `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":"*",` +
		`"Action":["s3:GetObject","s3:ListBucket"],"Resource":["arn:aws:s3:::data","arn:aws:s3:::data/*"]}]}`
	if _, err := f.s.Client.PutBucketPolicy(context.Background(), &s3.PutBucketPolicyInput{
		Bucket: aws.String("data"), Policy: aws.String(policy)}); err != nil {
		t.Fatal(err)
	}
	src, err := New(Config{Bucket: "data", Prefix: "pub/", Endpoint: f.proxy.URL, PathStyle: true})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	objs := list(t, src)
	if got, _ := read(t, src, objs["a"], 0, objs["a"].Size); string(got) != "public bytes" {
		t.Fatalf("read %q", got)
	}
	if plain, sdk := f.rec.counts(); plain != 1 || sdk != 0 {
		t.Fatalf("%d plain GETs and %d GetObject calls, want 1 and 0", plain, sdk)
	}
}

// TestPlanWithoutETag plans the read of an object listed with no ETag (as versitygw lists files
// put straight into its directory): the HEAD must carry no If-Match: "" (which such a server
// refuses as a failed precondition), and the object's checksum is still found; an object listed
// with its ETag is pinned to it.
func TestPlanWithoutETag(t *testing.T) {
	f := start(t)
	data := make([]byte, 64<<10)
	rand.Read(data)
	sum := f.putCRC32C(t, "set/big.bin", data)
	var mu sync.Mutex
	var ifMatch []string
	proxy := testpeers.StartProxy(t, f.s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method == http.MethodHead {
			mu.Lock()
			ifMatch = append(ifMatch, r.Header.Get("If-Match"))
			mu.Unlock()
		}
		return testpeers.None
	})
	src, err := New(Config{Bucket: "data", Prefix: "set/", Endpoint: proxy.URL, PathStyle: true,
		AccessKeyID: f.s.AccessKey, SecretAccessKey: f.s.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	listed, ok := list(t, src)["big.bin"]
	if !ok || listed.ETag == "" {
		t.Fatalf("big.bin listed %v with ETag %q", ok, listed.ETag)
	}
	for _, o := range []source.Object{listed, {Key: listed.Key, Size: listed.Size}} {
		plan, err := src.Plan(context.Background(), o)
		if err != nil {
			t.Fatalf("Plan of %q listed with ETag %q: %v", o.Key, o.ETag, err)
		}
		if plan.Checksum.Algorithm != "CRC32C" || plan.Checksum.Value != sum {
			t.Errorf("ETag %q: plan checksum %+v, want CRC32C %s", o.ETag, plan.Checksum, sum)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{`"` + listed.ETag + `"`, ""}; !slices.Equal(ifMatch, want) {
		t.Errorf("the HEADs carried If-Match %q, want %q", ifMatch, want)
	}
}
