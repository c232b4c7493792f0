package writeback_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

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

// TestResumeCRC64Upload resumes a multipart upload that a node plugin from before CRC-32C
// started with CRC-64/NVME (its journal records no algorithm): the part the server holds with
// the recorded checksum is not sent again, the others go with CRC-64/NVME (the server refuses
// another algorithm within one upload), and the object completes with its FULL_OBJECT
// CRC-64/NVME.
func TestResumeCRC64Upload(t *testing.T) {
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "out")
	upper := t.TempDir()
	data := randBytes(23, 12<<20)
	writeFile(t, filepath.Join(upper, "model.bin"), data)
	fi, err := os.Stat(filepath.Join(upper, "model.bin"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	up, err := s.Client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("out"), Key: aws.String("model.bin"),
		ChecksumAlgorithm: types.ChecksumAlgorithmCrc64nvme, ChecksumType: types.ChecksumTypeFullObject})
	if err != nil {
		t.Fatal(err)
	}
	part, err := s.Client.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("out"), Key: aws.String("model.bin"), UploadId: up.UploadId,
		PartNumber: aws.Int32(1), Body: bytes.NewReader(data[:5<<20]), ChecksumAlgorithm: types.ChecksumAlgorithmCrc64nvme})
	if err != nil {
		t.Fatal(err)
	}
	// The journal as the node plugin before CRC-32C wrote it.
	dir := t.TempDir()
	job := writeback.Job{Volume: "v", Upper: upper, Target: writeback.Target{Bucket: "out"}}
	jobJSON, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "v", "job.json"), jobJSON)
	key := fmt.Sprintf(`"path":"model.bin","size":%d,"mtime":%d,"upload":%q`, fi.Size(), fi.ModTime().UnixNano(), aws.ToString(up.UploadId))
	writeFile(t, filepath.Join(dir, "v", "log"), fmt.Appendf(nil, "{\"op\":\"upload\",%s}\n{\"op\":\"part\",%s,\"part\":1,\"etag\":%q,\"sum\":%q}\n",
		key, key, aws.ToString(part.ETag), aws.ToString(part.ChecksumCRC64NVME)))

	u, err := writeback.New(writeback.Config{Dir: dir, PartSize: 5 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var last writeback.Progress
	if err := u.Run(ctx, job, s.Client, func(p writeback.Progress) { last = p }); err != nil {
		t.Fatal(err)
	}
	if !last.Done || last.Sent != int64(len(data)-5<<20) {
		t.Errorf("progress %+v, want done with only the parts the server lacked sent (%d bytes)", last, len(data)-5<<20)
	}
	head, err := s.Client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("out"), Key: aws.String("model.bin"), ChecksumMode: types.ChecksumModeEnabled})
	if err != nil {
		t.Fatal(err)
	}
	if head.ChecksumType != types.ChecksumTypeFullObject || aws.ToString(head.ChecksumCRC64NVME) == "" {
		t.Errorf("object checksum %s %q, want a FULL_OBJECT CRC-64/NVME", head.ChecksumType, aws.ToString(head.ChecksumCRC64NVME))
	}
	if got := objects(t, s.Client, "out", "")["model.bin"]; !bytes.Equal(got, data) {
		t.Errorf("model.bin at the target: %d bytes, not what was written", len(got))
	}
}
