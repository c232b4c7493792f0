//go:build tools

// Package tools pins the S3 peers the dataset tests and benchmarks run against: versitygw (an S3
// gateway over a directory) and rclone (the benchmark's reference copier). `make s3-tools` builds
// them into $(CISTERN_CACHE)/<tool>-<version>/bin/.
package tools

import (
	_ "github.com/rclone/rclone"
	_ "github.com/versity/versitygw/cmd/versitygw"
)
