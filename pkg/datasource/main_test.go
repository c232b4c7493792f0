package datasource_test

import (
	"os"
	"testing"

	"github.com/cistern-csi/cistern/test/testutil"
)

// The caches these tests make keep a share of their pool free; a tmpfs keeps that share small
// whatever the host disk holds.
func TestMain(m *testing.M) { os.Exit(testutil.RunOnScratchTmpfs(m, "8g")) }
