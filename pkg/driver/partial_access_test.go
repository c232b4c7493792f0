package driver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cistern-csi/cistern/test/testpeers"
)

// TestPartialReaderNodeStage (issue 24, item 1), through the CSI socket and a real S3 server: a
// bucket policy lets anyone list the bucket and read one of its 21 objects. An administrator's
// PV stages the dataset; a VolumeManager PV of the same source, staged without credentials and
// retried as kubelet retries, is refused every time and never shows the tree.
func TestPartialReaderNodeStage(t *testing.T) {
	env := startDriver(t, testPool{name: "fast"})
	ctx := context.Background()
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "shared")
	for i := range 21 {
		s.Put(t, "shared", fmt.Sprintf("set/f%02d", i), []byte(strings.Repeat("team data ", 50+i)))
	}
	policy := `{"Version":"2012-10-17","Statement":[` +
		`{"Effect":"Allow","Principal":"*","Action":["s3:ListBucket"],"Resource":["arn:aws:s3:::shared"]},` +
		`{"Effect":"Allow","Principal":"*","Action":["s3:GetObject"],"Resource":["arn:aws:s3:::shared/set/f07"]}]}`
	if _, err := s.Client.PutBucketPolicy(ctx, &s3.PutBucketPolicyInput{Bucket: aws.String("shared"), Policy: aws.String(policy)}); err != nil {
		t.Fatal(err)
	}
	roMany := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
	}
	vc := map[string]string{"source": "s3://shared/set", "endpoint": s.Endpoint, "pathStyle": "true"}
	stage := func(id string, secrets map[string]string) error {
		_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id,
			StagingTargetPath: filepath.Join(env.dir, "staging", id), VolumeCapability: roMany, VolumeContext: vc, Secrets: secrets})
		return err
	}
	admin := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	if err := retryUnavailable(t, func() error { return stage("admin-static", admin) }); err != nil {
		t.Fatal(err)
	}
	tenant := "cistern-vm-team-b-0123456789"
	for i := range 60 {
		err := retryUnavailable(t, func() error { return stage(tenant, nil) })
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("attempt %d: %v, want PermissionDenied", i+1, err)
		}
	}
	if ents, err := os.ReadDir(filepath.Join(env.dir, "staging", tenant)); err == nil && len(ents) != 0 {
		t.Fatalf("the tenant's staging path shows %d entries", len(ents))
	}
}
