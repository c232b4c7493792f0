package s3source

import "github.com/aws/aws-sdk-go-v2/service/s3"

// Client is the source's S3 client, with its credentials, egress policy and TLS trust: the
// write-back of a volume's outputs (pkg/writeback) writes through it, under the same rules
// as the reads.
func (s *Source) Client() *s3.Client { return s.client }
