package writeback_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/cistern-csi/cistern/pkg/writeback"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// legacyS3 is versitygw behind a proxy that answers as an S3 server without flexible checksums
// (Fault.Legacy: Ceph RGW 16), counting the requests that upload a body (PUT) and those of them
// without Content-MD5. fault, when set, adds to the legacy answer of a request.
type legacyS3 struct {
	*testpeers.S3
	proxy          *testpeers.Proxy
	puts, noMD5    atomic.Int64
	mu             sync.Mutex
	fault          func(r *http.Request) testpeers.Fault
	withoutPayload bool // the client signs no payload hash (as over HTTPS)
}

func startLegacyS3(t *testing.T) *legacyS3 {
	l := &legacyS3{S3: testpeers.StartS3(t, "")}
	l.Bucket(t, "out")
	l.proxy = testpeers.StartProxy(t, l.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method == http.MethodPut {
			l.puts.Add(1)
			if r.Header.Get("Content-Md5") == "" {
				l.noMD5.Add(1)
			}
		}
		l.mu.Lock()
		fault := l.fault
		l.mu.Unlock()
		f := testpeers.Fault{ResetAfter: -1}
		if fault != nil {
			f = fault(r)
		}
		f.Legacy = true
		f.Name = "legacy"
		return f
	})
	return l
}

func (l *legacyS3) setFault(fault func(r *http.Request) testpeers.Fault) {
	l.mu.Lock()
	l.fault = fault
	l.mu.Unlock()
}

// client reaches versitygw through the legacy proxy.
func (l *legacyS3) client() *s3.Client {
	c := clientFor(l.S3, l.proxy.URL)
	if l.withoutPayload {
		c = s3.New(c.Options(), s3.WithAPIOptions(v4.SwapComputePayloadSHA256ForUnsignedPayloadMiddleware))
	}
	return c
}

// TestLegacyServer uploads a small file, an empty one and a multipart one (40 MiB in 8 MiB
// parts) to a server that answers no checksum: each body goes with its Content-MD5, the server's
// MD5 ETags confirm them, and the job completes in one pass with the objects byte-identical; the
// multipart object carries its part size (x-amz-meta-cistern-part-size). The volume's next job,
// nothing changed, finds every object at the target by its ETag and sends nothing.
func TestLegacyServer(t *testing.T) {
	l := startLegacyS3(t)
	upper := t.TempDir()
	want := map[string][]byte{"small.txt": randBytes(31, 3<<10), "empty": nil, "big.bin": randBytes(32, 40<<20+3)}
	for p, b := range want {
		writeFile(t, filepath.Join(upper, p), b)
	}
	u, err := writeback.New(writeback.Config{Dir: t.TempDir(), PartSize: 8 << 20, MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	job := writeback.Job{Volume: "claim", Upper: upper, Target: writeback.Target{Bucket: "out", Prefix: "w/"}}
	run := func(name string) writeback.Progress {
		t.Helper()
		if err := u.Add(job); err != nil {
			t.Fatal(err)
		}
		var last writeback.Progress
		ctx, cancel := context.WithTimeout(testCtx(t), time.Minute)
		defer cancel()
		if err := u.Run(ctx, job, l.client(), func(p writeback.Progress) { last = p }); err != nil {
			t.Fatalf("%s: %v (last pass: %v)", name, err, last.Err)
		}
		if err := u.Keep("claim"); err != nil {
			t.Fatal(err)
		}
		return last
	}
	var total int64
	for _, b := range want {
		total += int64(len(b))
	}
	first := run("first job")
	if !first.Done || first.Attempt != 1 || first.Sent != total {
		t.Errorf("first job: %+v, want done in one pass, %d bytes sent", first, total)
	}
	sameObjects(t, objects(t, l.Client, "out", "w/"), want)
	if l.proxy.Delivered("legacy") == 0 {
		t.Error("the proxy hid no checksum: not a legacy server")
	}
	if n, puts := l.noMD5.Load(), l.puts.Load(); n != 0 || puts != 2+6 {
		t.Errorf("%d of %d PUTs without Content-MD5; want 8 PUTs (2 files, 6 parts), all with it", n, puts)
	}
	head, err := l.Client.HeadObject(testCtx(t), &s3.HeadObjectInput{Bucket: aws.String("out"), Key: aws.String("w/big.bin")})
	if err != nil {
		t.Fatal(err)
	}
	if got := head.Metadata["cistern-part-size"]; got != "8388608" {
		t.Errorf("big.bin's cistern-part-size metadata %q, want 8388608 (metadata %v)", got, head.Metadata)
	}
	if etag := aws.ToString(head.ETag); !strings.HasSuffix(etag, `-6"`) {
		t.Errorf("big.bin's ETag %s, want a multipart ETag of 6 parts", etag)
	}

	puts, received := l.puts.Load(), l.proxy.Received.Load()
	second := run("second job")
	if second.Sent != 0 || !second.Done || second.FilesDone != len(want) {
		t.Errorf("second job, nothing changed: %+v, want done, nothing sent", second)
	}
	if n, b := l.puts.Load()-puts, l.proxy.Received.Load()-received; n != 0 || b != 0 {
		t.Errorf("second job: %d PUTs, %d body bytes reached the server; want none", n, b)
	}
	sameObjects(t, objects(t, l.Client, "out", "w/"), want)
}

// TestLegacyResume stops a multipart upload to a server without flexible checksums after some of
// its parts (the third refused, the job cancelled: a node plugin that stopped), and runs it again
// from the journal in a new Uploader, losing the server's answer to CompleteMultipartUpload: the
// held parts are confirmed by their recorded MD5 ETags and not sent again, the object at the key
// by its multipart ETag recomputed from the file with the recorded part size, and the upload
// completes byte-identical with no upload left open.
func TestLegacyResume(t *testing.T) {
	l := startLegacyS3(t)
	upper := t.TempDir()
	data := randBytes(33, 40<<20+5)
	writeFile(t, filepath.Join(upper, "model.bin"), data)
	cfg := writeback.Config{Dir: t.TempDir(), PartSize: 8 << 20, Concurrency: 1, MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}
	job := writeback.Job{Volume: "v", Upper: upper, Target: writeback.Target{Bucket: "out"}}
	l.setFault(func(r *http.Request) testpeers.Fault {
		if r.Method == http.MethodPut && r.URL.Query().Get("partNumber") == "3" {
			return testpeers.Fault{Status: http.StatusServiceUnavailable, Code: "ServiceUnavailable", ResetAfter: -1}
		}
		return testpeers.Fault{ResetAfter: -1}
	})
	u, err := writeback.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	var first int64
	err = u.Run(ctx, job, l.client(), func(p writeback.Progress) {
		first = p.Sent
		if p.Err != nil {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("first run: %v, want cancelled after the refused part", err)
	}
	if first < 2*8<<20 {
		t.Fatalf("the first run sent %d bytes, less than two parts", first)
	}

	var lost atomic.Bool
	l.setFault(func(r *http.Request) testpeers.Fault {
		if r.Method == http.MethodPost && r.URL.Query().Has("uploadId") && lost.CompareAndSwap(false, true) {
			return testpeers.Fault{ResetAfter: 0}
		}
		return testpeers.Fault{ResetAfter: -1}
	})
	u, err = writeback.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var last writeback.Progress
	if err := u.Run(testCtx(t), job, l.client(), func(p writeback.Progress) { last = p }); err != nil {
		t.Fatal(err)
	}
	if !lost.Load() {
		t.Error("no CompleteMultipartUpload answer was lost")
	}
	if want := int64(len(data)) - first; !last.Done || last.Sent != want {
		t.Errorf("resumed: %+v, want done with the %d bytes of parts held not sent again (%d bytes sent)", last, first, want)
	}
	if got := objects(t, l.Client, "out", "")["model.bin"]; !bytes.Equal(got, data) {
		t.Errorf("model.bin at the target: %d bytes, not what was written", len(got))
	}
	if n := openUploads(t, l.Client, "out"); n != 0 {
		t.Errorf("%d multipart uploads left open", n)
	}
}

// TestLegacyCorruptPart corrupts a part's body on its way to a server without flexible checksums
// (the client signs no payload hash, as over HTTPS): the server refuses it by its Content-MD5,
// the pass is retried, and the object at the target is what was written.
func TestLegacyCorruptPart(t *testing.T) {
	l := startLegacyS3(t)
	l.withoutPayload = true
	upper := t.TempDir()
	data := randBytes(34, 20<<20)
	writeFile(t, filepath.Join(upper, "model.bin"), data)
	var flipped atomic.Bool
	l.setFault(func(r *http.Request) testpeers.Fault {
		if r.Method == http.MethodPut && r.URL.Query().Get("partNumber") == "2" && flipped.CompareAndSwap(false, true) {
			return testpeers.Fault{FlipRequest: true, ResetAfter: -1}
		}
		return testpeers.Fault{ResetAfter: -1}
	})
	u, err := writeback.New(writeback.Config{Dir: t.TempDir(), PartSize: 8 << 20, MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var refused []error
	var last writeback.Progress
	if err := u.Run(testCtx(t), writeback.Job{Volume: "v", Upper: upper, Target: writeback.Target{Bucket: "out"}}, l.client(), func(p writeback.Progress) {
		if p.Err != nil {
			refused = append(refused, p.Err)
		}
		last = p
	}); err != nil {
		t.Fatal(err)
	}
	if !flipped.Load() || len(refused) != 1 || !strings.Contains(refused[0].Error(), "BadDigest") || !strings.Contains(refused[0].Error(), "Content-MD5") {
		t.Errorf("refusals %v, want the corrupted part's one, by its Content-MD5 (BadDigest)", refused)
	}
	if !last.Done || last.Attempt != 2 {
		t.Errorf("progress %+v, want done in a second pass", last)
	}
	if got := objects(t, l.Client, "out", "")["model.bin"]; !bytes.Equal(got, data) {
		t.Errorf("model.bin at the target: %d bytes, not what was written", len(got))
	}
}

// TestUnconfirmedTarget has the server answer a PutObject with neither a checksum nor an MD5
// ETag (as an SSE-KMS bucket answers): the job stops at once with ErrUnconfirmed, not retried,
// and is not done.
func TestUnconfirmedTarget(t *testing.T) {
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "out")
	target, err := url.Parse(s.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	var puts atomic.Int32
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ModifyResponse = func(resp *http.Response) error {
		for k := range resp.Header {
			if strings.HasPrefix(strings.ToLower(k), "x-amz-checksum") {
				resp.Header.Del(k)
			}
		}
		if resp.Request.Method == http.MethodPut {
			puts.Add(1)
			resp.Header.Set("ETag", `"a1b2c3d4e5f60718293a4b5c6d7e8f90"`)
		}
		return nil
	}
	proxy := httptest.NewServer(rp)
	t.Cleanup(proxy.Close)
	upper := t.TempDir()
	writeFile(t, filepath.Join(upper, "a.txt"), []byte("outputs"))
	u, err := writeback.New(writeback.Config{Dir: t.TempDir(), MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var last writeback.Progress
	ctx, cancel := context.WithTimeout(testCtx(t), time.Minute)
	defer cancel()
	err = u.Run(ctx, writeback.Job{Volume: "v", Upper: upper, Target: writeback.Target{Bucket: "out"}}, clientFor(s, proxy.URL),
		func(p writeback.Progress) { last = p })
	if !errors.Is(err, writeback.ErrUnconfirmed) {
		t.Fatalf("Run: %v, want ErrUnconfirmed", err)
	}
	if last.Attempt != 1 || last.Done || !errors.Is(last.Err, writeback.ErrUnconfirmed) || puts.Load() != 1 {
		t.Errorf("progress %+v after %d PUTs, want one failed pass, not done", last, puts.Load())
	}
	if done, _ := u.Done("v"); done {
		t.Error("Done after an unconfirmed upload")
	}
}
