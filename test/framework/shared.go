package framework

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var (
	shared    *ControlPlane
	sharedErr error
	sharedSet bool
)

// RunShared starts one control plane for a whole test binary, runs the tests, and stops it. Call
// it from TestMain; tests get the control plane with Shared:
//
//	func TestMain(m *testing.M) {
//		os.Exit(framework.RunShared(m, framework.Options{ControllerManager: true, Scheduler: true}))
//	}
//
// Logs go to _output/logs/<package>.shared/ and are kept when any test fails. If the control
// plane cannot start, the tests still run and Shared fails (or skips) each one that needs it.
func RunShared(m *testing.M, opts Options) int {
	sharedSet = true
	name := strings.TrimSuffix(filepath.Base(os.Args[0]), ".test") + ".shared"
	var logDir, dataDir string
	binDir, err := findBinDir()
	if err == nil {
		logDir, err = newLogDir(name)
	}
	if err == nil {
		dataDir, err = os.MkdirTemp("", "cistern-control-plane-")
	}
	if err == nil {
		begin := time.Now()
		shared, err = start(binDir, dataDir, logDir, opts)
		if err == nil {
			fmt.Fprintf(os.Stderr, "shared control plane (%s) ready in %s; KUBECONFIG=%s\n",
				shared.components(), time.Since(begin).Round(time.Millisecond), shared.Kubeconfig)
		}
	}
	sharedErr = err

	code := m.Run()

	if shared != nil {
		shared.Stop()
	}
	if dataDir != "" {
		_ = os.RemoveAll(dataDir)
	}
	if logDir != "" {
		finishLogDir(logDir, code != 0 || sharedErr != nil, func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, format+"\n", args...)
		})
	}
	return code
}

// Shared returns the control plane RunShared started for this test binary.
func Shared(t testing.TB) *ControlPlane {
	t.Helper()
	switch {
	case !sharedSet:
		t.Fatal("framework.Shared needs framework.RunShared in TestMain")
	case shared == nil && sharedErr != nil && strings.Contains(sharedErr.Error(), "make k8s-tools"):
		missing(t, sharedErr)
	case shared == nil:
		t.Fatalf("shared control plane did not start: %v", sharedErr)
	}
	return shared
}
