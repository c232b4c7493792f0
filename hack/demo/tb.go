package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// demoTB lets the demo reuse the test framework and test/e2e/cluster, which take a testing.TB:
// cleanups run when the demo stops, logs go to the demo's log, and a fatal error stops the
// start-up. Embedding testing.TB satisfies its unexported method; every method the framework
// calls is implemented here.
type demoTB struct {
	testing.TB
	dir string

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	temp     int
}

// errFatal unwinds the start-up after Fatal.
type errFatal struct{ msg string }

func (t *demoTB) Helper()                 {}
func (t *demoTB) Name() string            { return "demo" }
func (t *demoTB) Log(args ...any)         { logf("%s", fmt.Sprint(args...)) }
func (t *demoTB) Logf(f string, a ...any) { logf(f, a...) }
func (t *demoTB) Error(args ...any)       { t.fail(); logf("ERROR: %s", fmt.Sprint(args...)) }
func (t *demoTB) Errorf(f string, a ...any) {
	t.fail()
	logf("ERROR: "+f, a...)
}
func (t *demoTB) Fatal(args ...any)         { t.Fatalf("%s", fmt.Sprint(args...)) }
func (t *demoTB) Fatalf(f string, a ...any) { t.fail(); panic(errFatal{fmt.Sprintf(f, a...)}) }
func (t *demoTB) FailNow()                  { t.Fatalf("failed") }
func (t *demoTB) Fail()                     { t.fail() }
func (t *demoTB) Skip(args ...any)          { t.Fatal(args...) }
func (t *demoTB) Skipf(f string, a ...any)  { t.Fatalf(f, a...) }
func (t *demoTB) SkipNow()                  { t.Fatalf("skipped") }
func (t *demoTB) Skipped() bool             { return false }

func (t *demoTB) fail() {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
}

func (t *demoTB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

func (t *demoTB) Cleanup(f func()) {
	t.mu.Lock()
	t.cleanups = append(t.cleanups, f)
	t.mu.Unlock()
}

func (t *demoTB) TempDir() string {
	t.mu.Lock()
	t.temp++
	dir := filepath.Join(t.dir, "data", fmt.Sprintf("%03d", t.temp))
	t.mu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("%v", err)
	}
	return dir
}

// runCleanups runs the cleanups last-registered first, as testing does.
func (t *demoTB) runCleanups() {
	for {
		t.mu.Lock()
		n := len(t.cleanups)
		if n == 0 {
			t.mu.Unlock()
			return
		}
		f := t.cleanups[n-1]
		t.cleanups = t.cleanups[:n-1]
		t.mu.Unlock()
		func() {
			defer func() {
				if r := recover(); r != nil {
					logf("cleanup: %v", r)
				}
			}()
			f()
		}()
	}
}
