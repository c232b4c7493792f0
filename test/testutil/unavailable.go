package testutil

import (
	"os"
	"testing"
)

// Unavailable skips a test that this machine or this checkout cannot run (not root, no loop
// devices, a peer binary not built), saying why. Under CI=true, or with CISTERN_REQUIRE_PEERS set
// (the make targets that build the peers first), it fails instead: CI must not pass by skipping
// what it should have run. `make test` lists the tests that skipped at its end.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if MustRun() {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// MustRun reports whether a test that cannot run must fail rather than skip.
func MustRun() bool {
	return os.Getenv("CI") == "true" || os.Getenv("CISTERN_REQUIRE_PEERS") != ""
}
