package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
)

// session is the demo's framework.TB: the framework and test/e2e/cluster start what they start on
// its behalf, and register with it how to stop it. Logs go to the demo's log, temporary
// directories live under the demo's directory, and a fatal error ends the start-up goroutine as
// testing does (runtime.Goexit); run returns that error. close runs the cleanups.
type session struct {
	dir string

	mu       sync.Mutex
	cleanups []func()
	err      error
	temp     int
}

// run calls start on its own goroutine, so that a fatal error can end it, and returns the first
// error reported.
func (s *session) run(start func()) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		start()
	}()
	<-done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *session) Helper()      {}
func (s *session) Name() string { return "demo" }

func (s *session) Logf(format string, args ...any) { logf(format, args...) }

func (s *session) Errorf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	logf("ERROR: %s", msg)
	s.mu.Lock()
	if s.err == nil {
		s.err = fmt.Errorf("%s", msg)
	}
	s.mu.Unlock()
}

func (s *session) Fatal(args ...any) { s.Fatalf("%s", fmt.Sprint(args...)) }

func (s *session) Fatalf(format string, args ...any) {
	s.Errorf(format, args...)
	runtime.Goexit()
}

func (s *session) Failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err != nil
}

func (s *session) Cleanup(f func()) {
	s.mu.Lock()
	s.cleanups = append(s.cleanups, f)
	s.mu.Unlock()
}

func (s *session) TempDir() string {
	s.mu.Lock()
	s.temp++
	dir := filepath.Join(s.dir, "data", fmt.Sprintf("%03d", s.temp))
	s.mu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		s.Fatalf("%v", err)
	}
	return dir
}

// close runs the cleanups, last-registered first; a cleanup that fails is logged and the others
// still run.
func (s *session) close() {
	for {
		s.mu.Lock()
		n := len(s.cleanups)
		if n == 0 {
			s.mu.Unlock()
			return
		}
		f := s.cleanups[n-1]
		s.cleanups = s.cleanups[:n-1]
		s.mu.Unlock()
		done := make(chan struct{})
		// Its own goroutine: a cleanup calling Fatal ends only itself.
		go func() {
			defer close(done)
			f()
		}()
		<-done
	}
}
