package writeback_test

import (
	"net/http"
	"path/filepath"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/cistern-csi/cistern/pkg/writeback"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// sentHeaders records the headers of the PUTs a client sends.
type sentHeaders struct {
	next http.RoundTripper
	mu   sync.Mutex
	puts []http.Header
}

func (s *sentHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPut {
		s.mu.Lock()
		s.puts = append(s.puts, r.Header.Clone())
		s.mu.Unlock()
	}
	return s.next.RoundTrip(r)
}

// TestUploadOverTLS uploads a small and a multipart file to versitygw over HTTPS: each body goes
// plain (no aws-chunked trailer, which servers without flexible checksums do not read) with its
// CRC-32C and Content-MD5 in headers, unsigned (the SDK signs no payload hash over TLS, so it is
// not read again for a SHA-256), and the objects are what was written.
func TestUploadOverTLS(t *testing.T) {
	s := testpeers.StartS3TLS(t, "")
	s.Bucket(t, "out")
	upper := t.TempDir()
	want := map[string][]byte{"a.txt": randBytes(41, 5<<10), "big.bin": randBytes(42, 12<<20+1)}
	for p, b := range want {
		writeFile(t, filepath.Join(upper, p), b)
	}
	rec := &sentHeaders{next: s.Client.Options().HTTPClient.(*http.Client).Transport}
	client := s3.New(s.Client.Options(), func(o *s3.Options) { o.HTTPClient = &http.Client{Transport: rec} })
	u, err := writeback.New(writeback.Config{Dir: t.TempDir(), PartSize: 5 << 20})
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
	sameObjects(t, objects(t, s.Client, "out", ""), want)
	if len(rec.puts) != 1+3 {
		t.Errorf("%d PUTs, want 4 (a file, 3 parts)", len(rec.puts))
	}
	for _, h := range rec.puts {
		if h.Get("X-Amz-Content-Sha256") != "UNSIGNED-PAYLOAD" || h.Get("Content-Encoding") != "" ||
			h.Get("Content-Md5") == "" || h.Get("X-Amz-Checksum-Crc32c") == "" {
			t.Errorf("a PUT with x-amz-content-sha256 %q, content-encoding %q, Content-MD5 %q, x-amz-checksum-crc32c %q; want an unsigned plain body with both sums",
				h.Get("X-Amz-Content-Sha256"), h.Get("Content-Encoding"), h.Get("Content-Md5"), h.Get("X-Amz-Checksum-Crc32c"))
		}
	}
}
