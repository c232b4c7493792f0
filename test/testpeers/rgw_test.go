package testpeers

import (
	"context"
	"io"
	"os"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/cistern-csi/cistern/test/testutil"
)

// TestStartRGW starts the Ceph cluster, writes and reads an object through radosgw, and checks
// that Close leaves no directory behind.
func TestStartRGW(t *testing.T) {
	if err := RGWAvailable(); err != nil {
		testutil.Unavailable(t, "%v", err)
	}
	r, err := StartRGW(context.Background(), t.TempDir())
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
	dir := r.dir
	r.Close()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("cluster directory left behind: %v", err)
	}
}
