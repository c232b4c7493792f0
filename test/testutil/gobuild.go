package testutil

import (
	"bytes"
	"os"
	"os/exec"
)

// GoBuild returns the go build of pkgs into out (a file, or a directory ending in "/"). Like
// `make build` it sets main.version to $VERSION, which the Makefile exports (git describe), so
// the binaries a suite runs report the tree they came from; without it they say "dev".
func GoBuild(out string, pkgs ...string) *exec.Cmd {
	return goBuild(out, nil, pkgs)
}

// GoBuildRace is GoBuild with the race detector when RaceBinaries says so: the binaries a suite
// starts as processes are checked as go test -race checks the test's own. A suite that uses it
// must fail on the reports the child writes (RaceReports).
func GoBuildRace(out string, pkgs ...string) *exec.Cmd {
	if !RaceBinaries() {
		return GoBuild(out, pkgs...)
	}
	return goBuild(out, []string{"-race"}, pkgs)
}

// RaceBinaries reports whether GoBuildRace builds with -race: under CI=true, or with
// CISTERN_RACE_BINARIES=1 (the race build links for a minute or two more the first time).
func RaceBinaries() bool {
	return os.Getenv("CI") == "true" || os.Getenv("CISTERN_RACE_BINARIES") == "1"
}

func goBuild(out string, flags, pkgs []string) *exec.Cmd {
	args := append([]string{"build"}, flags...)
	if v := os.Getenv("VERSION"); v != "" {
		args = append(args, "-ldflags", "-X main.version="+v)
	}
	args = append(args, "-o", out)
	return exec.Command("go", append(args, pkgs...)...)
}

// raceBanner opens every report of the race detector.
var raceBanner = []byte("WARNING: DATA RACE")

// RaceReports returns the race detector's reports in a child's output (its log file): each from
// its banner to the line of equals signs that ends it, or to the end.
func RaceReports(output []byte) []string {
	var out []string
	for {
		i := bytes.Index(output, raceBanner)
		if i < 0 {
			return out
		}
		output = output[i:]
		end := bytes.Index(output, []byte("\n=================="))
		if end < 0 {
			end = len(output)
		}
		out = append(out, string(output[:end]))
		output = output[end:]
	}
}
