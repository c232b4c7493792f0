package testutil

import (
	"context"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/test/framework"
)

// Eventually is framework.Eventually for a condition that needs no context.
func Eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	framework.Eventually(t, timeout, what, func(context.Context) error { return cond() })
}

// Context is a context for one test's API calls, cancelled when it ends and after 5 minutes.
func Context(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
