package writeback_test

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/cistern-csi/cistern/test/testpeers"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// clientFor is a client of s reaching it at endpoint (the server, or a proxy before it).
func clientFor(s *testpeers.S3, endpoint string) *s3.Client {
	return s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(endpoint), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
		HTTPClient:  &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
	})
}

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func writeFile(t *testing.T, p string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// objects reads every object under prefix of bucket: key (without prefix) -> bytes.
func objects(t *testing.T, c *s3.Client, bucket, prefix string) map[string][]byte {
	t.Helper()
	ctx := testCtx(t)
	out := map[string][]byte{}
	pages := s3.NewListObjectsV2Paginator(c, &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(prefix)})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range page.Contents {
			g, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: o.Key})
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(g.Body)
			g.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			out[aws.ToString(o.Key)[len(prefix):]] = b
		}
	}
	return out
}

// sameObjects fails unless got holds exactly want, byte for byte.
func sameObjects(t *testing.T, got, want map[string][]byte) {
	t.Helper()
	var keys []string
	for k := range got {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for k, w := range want {
		if g, ok := got[k]; !ok {
			t.Errorf("%s: not at the target", k)
		} else if !bytes.Equal(g, w) {
			t.Errorf("%s: %d bytes at the target differ from the %d written", k, len(g), len(w))
		}
	}
	for _, k := range keys {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: at the target, not written", k)
		}
	}
}

// openUploads counts the multipart uploads under way in bucket.
func openUploads(t *testing.T, c *s3.Client, bucket string) int {
	t.Helper()
	out, err := c.ListMultipartUploads(testCtx(t), &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket)})
	if err != nil {
		t.Fatal(err)
	}
	return len(out.Uploads)
}
