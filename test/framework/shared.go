package framework

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The control plane shared by a test binary: started by the first Shared call, stopped by
// RunShared after the tests.
var shared struct {
	enabled bool
	opts    Options
	once    sync.Once
	cp      *ControlPlane
	err     error
	logDir  string
	dataDir string

	setupOnce sync.Once
	setupErr  error
}

// RunShared runs the tests of a binary that share one control plane, then stops it. Call it from
// TestMain; tests get the control plane with Shared:
//
//	func TestMain(m *testing.M) {
//		os.Exit(framework.RunShared(m, framework.Options{ControllerManager: true, Scheduler: true}))
//	}
//
// The control plane starts when the first test calls Shared, so a run that selects no such test
// (go test -run) pays nothing. Logs go to _output/logs/<package>.shared/ and are kept when any
// test fails.
func RunShared(m *testing.M, opts Options) int {
	shared.enabled, shared.opts = true, opts
	code := m.Run()

	if shared.cp != nil {
		shared.cp.Stop()
	}
	if shared.dataDir != "" {
		_ = os.RemoveAll(shared.dataDir)
	}
	if shared.logDir != "" {
		finishLogDir(shared.logDir, code != 0 || shared.err != nil, func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, format+"\n", args...)
		})
	}
	return code
}

// Shared returns the control plane shared by the tests of this binary (see RunShared), starting
// it on first use. If it cannot start, every test that asks for it fails (or skips, when the
// binaries are not built and CI is not true).
func Shared(t TB) *ControlPlane {
	t.Helper()
	if !shared.enabled {
		t.Fatal("framework.Shared needs framework.RunShared in TestMain")
	}
	shared.once.Do(func() { shared.cp, shared.err = startShared(t) })
	switch {
	case errors.Is(shared.err, errBinariesMissing):
		missing(t, shared.err)
	case shared.err != nil:
		t.Fatalf("shared control plane did not start: %v", shared.err)
	}
	return shared.cp
}

// SharedSetup returns the shared control plane (see Shared) after setup has run on it once for the
// whole binary: installing CRDs and RBAC, starting a controller in this process. Every test of the
// suite calls it first; if setup failed (or failed the test it ran in), every caller fails with
// that error.
func SharedSetup(t TB, setup func(cp *ControlPlane) error) *ControlPlane {
	t.Helper()
	cp := Shared(t)
	shared.setupOnce.Do(func() {
		shared.setupErr = errors.New("setup did not finish")
		shared.setupErr = setup(cp)
	})
	if shared.setupErr != nil {
		t.Fatalf("suite setup: %v", shared.setupErr)
	}
	return cp
}

func startShared(t TB) (*ControlPlane, error) {
	binDir, err := findBinDir()
	if err != nil {
		return nil, err
	}
	name := strings.TrimSuffix(filepath.Base(os.Args[0]), ".test") + ".shared"
	if shared.logDir, err = newLogDir(name); err != nil {
		return nil, err
	}
	if shared.dataDir, err = os.MkdirTemp("", "cistern-control-plane-"); err != nil {
		return nil, err
	}
	begin := time.Now()
	cp, err := start(binDir, shared.dataDir, shared.logDir, shared.opts)
	if err != nil {
		return nil, err
	}
	t.Logf("shared control plane (%s) ready in %s; KUBECONFIG=%s",
		cp.components(), time.Since(begin).Round(time.Millisecond), cp.Kubeconfig)
	return cp, nil
}
