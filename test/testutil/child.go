package testutil

import (
	"os"
	"os/exec"
	"testing"
)

// childEnv names the child function that a test binary started by ChildCommand runs.
const childEnv = "CISTERN_TEST_CHILD"

// RunChild, called first in a package's TestMain, runs the child of children that this binary
// was started as (ChildCommand) and exits with its result; in a binary started by go test it
// returns at once. A child is test code with a *testing.T of its own (t.Fatal, t.TempDir and
// t.Cleanup work as in a test), but it is not a test: a helper process written as a Test
// function that skips unless its environment is set would be one more skip in every run.
func RunChild(children map[string]func(t *testing.T)) {
	name := os.Getenv(childEnv)
	if name == "" {
		return
	}
	run, ok := children[name]
	if !ok {
		os.Stderr.WriteString("testutil: no child " + name + "\n")
		os.Exit(2)
	}
	// testing.Main runs the child as the only test of a testing.M of its own (the flags, the
	// -test.v output, the timeout) and exits; testing.RunTests would not, before an M's Run has
	// set up the CPU list it loops over.
	all := func(string, string) (bool, error) { return true, nil }
	testing.Main(all, []testing.InternalTest{{Name: name, F: run}}, nil, nil)
}

// ChildCommand returns a command that runs this test binary as child name of its package's
// RunChild, with env added to the test's environment; -test.v makes it log as a verbose test.
func ChildCommand(name string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.v")
	cmd.Env = append(append(os.Environ(), childEnv+"="+name), env...)
	return cmd
}
