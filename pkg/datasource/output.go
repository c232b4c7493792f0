package datasource

import (
	"slices"

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

// OutputNFS is the identity (AUTH_SYS uid and gid: the node's, --nfs-uid/--nfs-gid) the
// write-back of a volume of spec's dataset writes an NFS target on host with. A tenant's volume
// (an inline volume, a VolumeManager's) may name only the servers its NFS datasets may
// (--nfs-servers): NFSv3 has no credentials of the tenant's own, so which servers a pod author
// may have the node write to is the administrator's choice.
func (d *Datasets) OutputNFS(spec *Spec, host string) (uid, gid uint32, err error) {
	m := d.m
	if (spec.Tenant || spec.Inline) && !slices.Contains(m.cfg.NFSServers, host) {
		return 0, 0, source.Errorf(source.Denied, "NFS server %s is not allowed as an output target of a tenant's volume (the administrator allows servers with --nfs-servers)", host)
	}
	return m.nfsUID, m.nfsGID, nil
}
