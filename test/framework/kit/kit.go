package kit

import (
	"context"
	"path/filepath"
	"runtime"
	"time"
)

// RepoRoot is the root of the repository this package was built from (deploy/, _output/, the
// modules under hack/): tests and hack/demo read manifests and write logs there.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// Eventually calls cond every 250ms, each time with a context of its own (30 s), until it returns
// nil, and fails the test with cond's last error once timeout has passed. Every suite waits here.
func Eventually(t TB, timeout time.Duration, what string, cond func(ctx context.Context) error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := cond(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not after %s: %v", what, timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
