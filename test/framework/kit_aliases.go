package framework

import "github.com/cistern-csi/cistern/test/framework/kit"

// TB is what the framework needs from its caller (kit.TB): *testing.T and *testing.B satisfy it;
// hack/demo implements it itself.
type TB = kit.TB

// The client-free part of the kit (test/framework/kit), under the names the suites use.
var (
	FreePort      = kit.FreePort
	FreePorts     = kit.FreePorts
	FreeAddr      = kit.FreeAddr
	RepoRoot      = kit.RepoRoot
	Eventually    = kit.Eventually
	WaitListening = kit.WaitListening
	ErrExited     = kit.ErrExited
)
