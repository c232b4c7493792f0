package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// S3 is a running versitygw (testpeers.StartVersitygw) with the datasets the e2e suite and the demo
// upload.
type S3 struct{ *testpeers.S3 }

// StartS3 serves dir over S3 with the versitygw binary bin (testpeers.VersitygwBinary).
func StartS3(t framework.TB, bin, dir string) *S3 {
	t.Helper()
	return &S3{testpeers.StartVersitygw(t, bin, dir)}
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
	client := s.Client
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
