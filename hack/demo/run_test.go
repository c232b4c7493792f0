package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/cistern-csi/cistern/test/framework"
)

var _ framework.TB = (*session)(nil)

// TestSessionFatalEndsStartUp: Fatalf ends the start-up where it is called, run returns its
// message, and close runs the cleanups last-registered first, also one that calls Fatal.
func TestSessionFatalEndsStartUp(t *testing.T) {
	s := &session{dir: t.TempDir()}
	var order []string
	reached := false
	err := s.run(func() {
		s.Cleanup(func() { order = append(order, "first") })
		s.Cleanup(func() { order = append(order, "second"); s.Fatal("cleanup failed") })
		s.Cleanup(func() { order = append(order, "third") })
		s.Fatalf("control plane: %s", "no etcd")
		reached = true
	})
	if err == nil || !strings.Contains(err.Error(), "control plane: no etcd") {
		t.Fatalf("run returned %v, want the fatal message", err)
	}
	if reached || !s.Failed() {
		t.Fatalf("code after Fatalf ran: %v, Failed: %v", reached, s.Failed())
	}
	s.close()
	if want := []string{"third", "second", "first"}; !slices.Equal(order, want) {
		t.Fatalf("cleanups ran %v, want %v", order, want)
	}
}

func TestSessionTempDirsAreDistinct(t *testing.T) {
	s := &session{dir: t.TempDir()}
	var a, b string
	if err := s.run(func() { a, b = s.TempDir(), s.TempDir() }); err != nil {
		t.Fatal(err)
	}
	if a == b || !strings.HasPrefix(a, s.dir) {
		t.Fatalf("TempDir gave %q and %q under %q", a, b, s.dir)
	}
}
