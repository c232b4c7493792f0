//go:build tools

// Package tools pins SeaweedFS, the second S3 server the compatibility suite (test/s3compat) runs
// against. `make seaweedfs` builds its weed binary into $(CISTERN_CACHE)/seaweedfs-<version>/bin/.
package tools

import (
	_ "github.com/seaweedfs/seaweedfs/weed"
)
