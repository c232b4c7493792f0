package testutil

import (
	"context"
	"testing"
	"time"
)

// Eventually polls cond every 200ms until it returns nil, and fails the test with cond's last
// error once timeout has passed.
func Eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: not after %s: %v", what, timeout, err)
}

// Context is a context for one test's API calls, cancelled when it ends and after 5 minutes.
func Context(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
