// Package testpeers starts the real servers dataset tests run against: versitygw (S3 over a
// directory), a go-nfs server, and a fault-injecting HTTP proxy placed in front of S3.
package testpeers

import (
	"bytes"
	"context"
	"crypto/md5"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/cistern-csi/cistern/test/framework/kit"
	"github.com/cistern-csi/cistern/test/testutil"
)

// S3 is a running versitygw with a posix backend.
type S3 struct {
	Endpoint  string
	AccessKey string
	SecretKey string
	// Dir is the backend directory: <Dir>/<bucket>/<key>.
	Dir    string
	Client *s3.Client
	cmd    *exec.Cmd
}

// VersitygwVersion is what the datasource area's `make s3-tools` builds.
const VersitygwVersion = "v1.8.0"

// VersitygwBinary finds versitygw from $CISTERN_VERSITYGW or the cache; "" if it is not built.
func VersitygwBinary() string {
	if p := os.Getenv("CISTERN_VERSITYGW"); p != "" {
		return p
	}
	cache := os.Getenv("CISTERN_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "cistern")
	}
	p := filepath.Join(cache, "versitygw-"+VersitygwVersion, "bin", "versitygw-static") // as hack/make/30-datasource.mk builds it
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// Binary finds a peer binary from its environment variable; without it the test is skipped,
// unless CISTERN_REQUIRE_PEERS is set (make test-datasource) or CI=true, when it fails.
func Binary(t testing.TB, env string) string {
	t.Helper()
	p := os.Getenv(env)
	if p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	testutil.Unavailable(t, "%s=%q: binary missing; run through make test-datasource (make s3-tools builds the S3 tools; make bench-datasource also installs awscli)", env, p)
	return ""
}

// StartS3 starts versitygw ($CISTERN_VERSITYGW) on loopback over dir (a temp dir when empty), with
// static root credentials, and stops it when the test ends.
func StartS3(t testing.TB, dir string) *S3 {
	t.Helper()
	return startS3(t, dir, nil)
}

// startS3 starts versitygw; with tlsFiles (certificate, key) it serves HTTPS.
func startS3(t testing.TB, dir string, tlsFiles []string) *S3 {
	t.Helper()
	bin := Binary(t, "CISTERN_VERSITYGW")
	if dir == "" {
		dir = t.TempDir()
	}
	return startVersitygw(t, bin, dir, tlsFiles)
}

// StartVersitygw serves dir over S3 with the versitygw binary bin on a free loopback port, static
// root credentials and keep-alive, until the test (or hack/demo) ends: the one place the test kit
// starts an S3 server. It takes a kit.TB, so that it links no Kubernetes client.
func StartVersitygw(t kit.TB, bin, dir string) *S3 {
	t.Helper()
	return startVersitygw(t, bin, dir, nil)
}

// startVersitygw is StartVersitygw; with tlsFiles (certificate, key) it serves HTTPS.
func startVersitygw(t kit.TB, bin, dir string, tlsFiles []string) *S3 {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	addr := kit.FreeAddr(t)
	s := &S3{Endpoint: "http://" + addr, AccessKey: "cistern-test", SecretKey: "cistern-test-secret", Dir: dir}
	args := []string{"--port", addr, "--access", s.AccessKey, "--secret", s.SecretKey, "--keep-alive", "--quiet"}
	if tlsFiles != nil {
		s.Endpoint = "https://" + addr
		args = append(args, "--cert", tlsFiles[0], "--key", tlsFiles[1])
	}
	s.cmd = exec.Command(bin, append(args, "posix", dir)...)
	var out bytes.Buffer
	s.cmd.Stdout, s.cmd.Stderr = &out, &out
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = s.cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		<-exited
	})
	if err := kit.WaitListening(addr, 30*time.Second, exited); err != nil {
		t.Fatalf("versitygw: %v: %s", err, out.String())
	}
	if tlsFiles == nil {
		s.Client = s.NewClient(s.Endpoint)
	}
	return s
}

// Pid is the S3 server's process (benchmarks count its CPU time).
func (s *S3) Pid() int { return s.cmd.Process.Pid }

// NewClient returns a client for endpoint with the root credentials.
func (s *S3) NewClient(endpoint string) *s3.Client {
	return s.newClient(endpoint, &http.Transport{MaxIdleConnsPerHost: 64})
}

func (s *S3) newClient(endpoint string, tr *http.Transport) *s3.Client {
	return s3.New(s3.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
		HTTPClient:   &http.Client{Transport: tr},
	})
}

// Bucket creates a bucket.
func (s *S3) Bucket(t testing.TB, name string) {
	t.Helper()
	if _, err := s.Client.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		t.Fatalf("create bucket %s: %v", name, err)
	}
}

// Put uploads one object in a single PUT (its ETag is the MD5 of the data).
func (s *S3) Put(t testing.TB, bucket, key string, data []byte) {
	t.Helper()
	if _, err := s.Client.PutObject(context.Background(), &s3.PutObjectInput{
		Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader(data),
	}); err != nil {
		t.Fatalf("put %s/%s: %v", bucket, key, err)
	}
}

// PutMultipart uploads an object in parts of partSize (its ETag is composite, "<md5>-<parts>").
// next returns the bytes of part i; parts are produced one at a time to keep memory flat.
func (s *S3) PutMultipart(t testing.TB, bucket, key string, size, partSize int64, next func(i int, buf []byte)) {
	t.Helper()
	ctx := context.Background()
	up, err := s.Client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		t.Fatal(err)
	}
	var parts []types.CompletedPart
	buf := make([]byte, partSize)
	for i, off := 1, int64(0); off < size; i, off = i+1, off+partSize {
		n := min(partSize, size-off)
		next(i-1, buf[:n])
		sum := md5.Sum(buf[:n])
		out, err := s.Client.UploadPart(ctx, &s3.UploadPartInput{
			Bucket: aws.String(bucket), Key: aws.String(key), UploadId: up.UploadId,
			PartNumber: aws.Int32(int32(i)), Body: bytes.NewReader(buf[:n]),
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Trim(aws.ToString(out.ETag), `"`); got != fmt.Sprintf("%x", sum) {
			t.Fatalf("part %d ETag %s, want MD5 %x", i, got, sum)
		}
		parts = append(parts, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(int32(i))})
	}
	if _, err := s.Client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket: aws.String(bucket), Key: aws.String(key), UploadId: up.UploadId,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
	}); err != nil {
		t.Fatal(err)
	}
}
