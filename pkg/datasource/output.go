package datasource

import (
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/cistern-csi/cistern/pkg/datasource/s3source"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// OutputClient is an S3 client for the write-back of a volume of spec's dataset to bucket: the
// dataset's endpoint, region and CA bundle, creds (the tenant's own), and the endpoint policy
// that applies to the dataset (--tenant-s3-endpoints for a pod author's). Writes go where reads
// may, no further.
func (d *Datasets) OutputClient(spec *Spec, creds Credentials, bucket string) (*s3.Client, error) {
	m := d.m
	if spec.Scheme != SchemeS3 {
		return nil, source.Errorf(source.Invalid, "an output target needs an S3 dataset; %s is not one", spec.Describe())
	}
	policy, err := m.egressPolicy(spec)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := m.s3TLS(spec)
	if err != nil {
		return nil, err
	}
	src, err := s3source.New(s3source.Config{
		Bucket: bucket, Endpoint: spec.Endpoint, Region: spec.Region, PathStyle: spec.PathStyle,
		AccessKeyID: creds.AccessKeyID, SecretAccessKey: creds.SecretAccessKey, SessionToken: creds.SessionToken,
		WebIdentity: m.webIdentity(creds), MaxConns: 64, Egress: policy, TLS: tlsCfg,
	})
	if err != nil {
		return nil, err
	}
	return src.Client(), nil
}
