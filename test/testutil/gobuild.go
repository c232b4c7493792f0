package testutil

import (
	"os"
	"os/exec"
)

// GoBuild returns the go build of pkgs into out (a file, or a directory ending in "/"). Like
// `make build` it sets main.version to $VERSION, which the Makefile exports (git describe), so
// the binaries a suite runs report the tree they came from; without it they say "dev".
func GoBuild(out string, pkgs ...string) *exec.Cmd {
	args := []string{"build"}
	if v := os.Getenv("VERSION"); v != "" {
		args = append(args, "-ldflags", "-X main.version="+v)
	}
	args = append(args, "-o", out)
	return exec.Command("go", append(args, pkgs...)...)
}
