// Package s3compat runs the same dataset cases (staged, streaming, hostile keys, a changed
// object, multipart with and without checksums, a corrupted byte, write-back) against every S3
// server Cistern supports: versitygw, SeaweedFS and Ceph RGW. Each case prints one line,
//
//	s3compat: server=<name> case=<name> result=pass|fail checksum=<what verified the bytes>
//
// where checksum comes from the engine's cistern_dataset_verified_files_total{checksum} for
// staging, and from what the server answered for streaming and write-back (docs/datasets.md,
// "S3 servers").
package s3compat
