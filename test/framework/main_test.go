package framework_test

import (
	"os"
	"testing"

	"github.com/cistern-csi/cistern/test/framework"
)

// The tests below share one full control plane, as a big suite would; TestStartControlPlane
// starts its own.
func TestMain(m *testing.M) {
	os.Exit(framework.RunShared(m, framework.Options{ControllerManager: true, Scheduler: true}))
}
