package datasource_test

import (
	"os"
	"testing"

	"github.com/cistern-csi/cistern/test/testutil"
)

// The caches these tests make keep a share of their pool free; a tmpfs keeps that share small
// whatever the host disk holds. A child process (TestCrashResume's staging) runs on its parent's.
func TestMain(m *testing.M) {
	testutil.RunChild(map[string]func(*testing.T){"staging": stagingChild})
	os.Exit(testutil.RunOnScratchTmpfs(m, "8g"))
}
