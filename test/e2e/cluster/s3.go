package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path"
	"path/filepath"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/cistern-csi/cistern/test/framework"
)

// VersitygwVersion is what the datasource area's `make s3-tools` builds.
const VersitygwVersion = "v1.8.0"

// S3 is a running versitygw serving a directory (posix backend: <Dir>/<bucket>/<key>).
type S3 struct {
	Endpoint             string
	AccessKey, SecretKey string
	Dir                  string
}

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
	p := filepath.Join(cache, "versitygw-"+VersitygwVersion, "bin", "versitygw")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// StartS3 serves dir over S3 on a loopback port with static credentials.
func StartS3(t framework.TB, bin, dir string) *S3 {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	s := &S3{Endpoint: "http://" + addr, AccessKey: "cistern-demo", SecretKey: "cistern-demo-secret", Dir: dir}
	p := framework.StartProcess(t, "versitygw", bin, "--port", addr, "--access", s.AccessKey, "--secret", s.SecretKey, "--quiet", "posix", dir)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return s
		}
		select {
		case <-p.Done():
			t.Fatalf("versitygw exited: %v (log %s)", p.Err(), p.LogPath)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("versitygw not listening on %s (log %s)", addr, p.LogPath)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// SampleDataset uploads a small dataset to bucket (created) under prefix through the S3 API and
// returns each relative path with its SHA-256.
func (s *S3) SampleDataset(ctx context.Context, bucket, prefix string) (map[string]string, error) {
	files := map[string][]byte{
		"README.txt": []byte("A tiny sample dataset served by versitygw for Cistern.\n"),
		"labels.csv": []byte("id,label\n0,cat\n1,dog\n2,bird\n"),
	}
	for i := range 3 {
		data := make([]byte, 256<<10)
		for j := range data {
			data[j] = byte((i*131 + j*7) % 251)
		}
		files[fmt.Sprintf("train/shard-%04d.bin", i)] = data
	}
	return s.upload(ctx, bucket, prefix, files)
}

// RandomDataset uploads count objects of size random bytes (the same for the same prefix)
// under prefix to bucket (created if needed) and returns each relative path with its SHA-256.
func (s *S3) RandomDataset(ctx context.Context, bucket, prefix string, count, size int) (map[string]string, error) {
	seed := sha256.Sum256([]byte(prefix))
	rng := rand.NewChaCha8(seed)
	files := map[string][]byte{}
	for i := range count {
		data := make([]byte, size)
		_, _ = rng.Read(data)
		files[fmt.Sprintf("part-%05d.bin", i)] = data
	}
	return s.upload(ctx, bucket, prefix, files)
}

func (s *S3) upload(ctx context.Context, bucket, prefix string, files map[string][]byte) (map[string]string, error) {
	client := s3.New(s3.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(s.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
	})
	_, err := client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)})
	var owned *types.BucketAlreadyOwnedByYou
	if err != nil && !errors.As(err, &owned) {
		return nil, fmt.Errorf("creating bucket %s: %w", bucket, err)
	}
	sums := map[string]string{}
	for rel, data := range files {
		key := path.Join(prefix, rel)
		if _, err := client.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader(data)}); err != nil {
			return nil, fmt.Errorf("uploading %s: %w", key, err)
		}
		sum := sha256.Sum256(data)
		sums[rel] = hex.EncodeToString(sum[:])
	}
	return sums, nil
}

// VerifyFiles checks that every file of want is under root with that SHA-256.
func VerifyFiles(root string, want map[string]string) error {
	for rel, sum := range want {
		data, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return err
		}
		got := sha256.Sum256(data)
		if hex.EncodeToString(got[:]) != sum {
			return fmt.Errorf("%s: content differs from the source", rel)
		}
	}
	return nil
}
