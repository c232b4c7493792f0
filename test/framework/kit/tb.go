package kit

// TB is what the framework needs from its caller. *testing.T and *testing.B satisfy it; a program
// that reuses the framework outside go test (hack/demo) implements it itself. As in testing, Fatal
// and Fatalf must not return (testing ends the goroutine with runtime.Goexit), and cleanups run
// last-registered first when the caller is done.
type TB interface {
	Helper()
	Name() string
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Failed() bool
	Cleanup(func())
	TempDir() string
}
