package s3compat

import (
	"context"
	"io"
	"os"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// TestRGWCleanup starts a Ceph cluster of its own, writes and reads an object through radosgw,
// and checks that Close stops it and leaves no directory behind.
func TestRGWCleanup(t *testing.T) {
	if err := testpeers.RGWAvailable(); err != nil {
		testutil.Unavailable(t, "%v", err)
	}
	parent := t.TempDir()
	r, err := testpeers.StartRGW(context.Background(), parent)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	t.Logf("rgw setup took %s", r.Setup)
	r.Bucket(t, "bkt")
	r.Put(t, "bkt", "k", []byte("hello"))
	out, err := r.Client.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k")})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(out.Body)
	out.Body.Close()
	if err != nil || string(got) != "hello" {
		t.Fatalf("read back %q: %v", got, err)
	}
	r.Close()
	if ents, err := os.ReadDir(parent); err != nil || len(ents) != 0 {
		t.Fatalf("left behind: %v %v", ents, err)
	}
	if _, err := r.Client.ListBuckets(context.Background(), &s3.ListBucketsInput{}); err == nil {
		t.Fatal("radosgw still answers after Close")
	}
}
