package writeback_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/cistern-csi/cistern/pkg/writeback"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// TestSlowComplete has the server answer CompleteMultipartUpload later than the client waits
// for response headers (as versitygw does while it copies a large object's parts into it on a
// busy disk): the object is assembled once, from one Complete, and the upload finishes.
func TestSlowComplete(t *testing.T) {
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "out")
	upper := t.TempDir()
	data := randBytes(21, 12<<20)
	writeFile(t, filepath.Join(upper, "model.bin"), data)

	target, err := url.Parse(s.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	var completes atomic.Int32
	rp := httputil.NewSingleHostReverseProxy(target)
	// The server has done the work; its answer arrives after the client's timeout.
	rp.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.Method == http.MethodPost && resp.Request.URL.Query().Has("uploadId") {
			completes.Add(1)
			time.Sleep(1500 * time.Millisecond)
		}
		return nil
	}
	proxy := httptest.NewServer(rp)
	t.Cleanup(proxy.Close)
	client := s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(proxy.URL), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
		HTTPClient:  &http.Client{Transport: &http.Transport{ResponseHeaderTimeout: 500 * time.Millisecond}},
	})

	u, err := writeback.New(writeback.Config{Dir: t.TempDir(), PartSize: 5 << 20, MinBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var last writeback.Progress
	if err := u.Run(testCtx(t), writeback.Job{Volume: "v", Upper: upper, Target: writeback.Target{Bucket: "out"}}, client,
		func(p writeback.Progress) { last = p }); err != nil {
		t.Fatal(err)
	}
	if !last.Done || last.Attempt != 1 {
		t.Errorf("progress %+v, want done in one pass", last)
	}
	if n := completes.Load(); n != 1 {
		t.Errorf("the server assembled the object %d times, want once", n)
	}
	if got := objects(t, s.Client, "out", "")["model.bin"]; !bytes.Equal(got, data) {
		t.Errorf("model.bin at the target: %d bytes, not what was written", len(got))
	}
}

// TestCompleteAnswerLost loses the server's answer to CompleteMultipartUpload (the connection
// reset after the server assembled the object, as a client timeout or a crash would lose it):
// the next pass finds the upload gone (ListParts: NoSuchUpload) and the object at its key whole,
// and records it done without sending any part again.
func TestCompleteAnswerLost(t *testing.T) {
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "out")
	upper := t.TempDir()
	data := randBytes(22, 12<<20)
	writeFile(t, filepath.Join(upper, "model.bin"), data)
	var lost atomic.Bool
	proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method == http.MethodPost && r.URL.Query().Has("uploadId") && lost.CompareAndSwap(false, true) {
			return testpeers.Fault{ResetAfter: 0}
		}
		return testpeers.None
	})
	u, err := writeback.New(writeback.Config{Dir: t.TempDir(), PartSize: 5 << 20, MinBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var last writeback.Progress
	if err := u.Run(testCtx(t), writeback.Job{Volume: "v", Upper: upper, Target: writeback.Target{Bucket: "out"}}, clientFor(s, proxy.URL),
		func(p writeback.Progress) { last = p }); err != nil {
		t.Fatal(err)
	}
	if !lost.Load() {
		t.Fatal("no CompleteMultipartUpload went through the proxy")
	}
	if !last.Done || last.Sent != int64(len(data)) {
		t.Errorf("progress %+v, want done with each byte sent once (%d)", last, len(data))
	}
	if got := objects(t, s.Client, "out", "")["model.bin"]; !bytes.Equal(got, data) {
		t.Errorf("model.bin at the target: %d bytes, not what was written", len(got))
	}
	if n := openUploads(t, s.Client, "out"); n != 0 {
		t.Errorf("%d multipart uploads left open", n)
	}
}
