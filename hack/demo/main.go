// Command demo runs Cistern on this machine: a local control plane, an S3 server with a small
// sample dataset, and for two simulated nodes the CSI driver, the external-provisioner and the
// storagepool-sidecar, plus the workload-controller; then it shows what they did.
//
//	demo up   --dir DIR   start everything in the background (if not running) and show it
//	demo down --dir DIR   stop everything, unmount and detach what it made, remove DIR
//
// `make demo` and `make demo-down` run it; see docs/demo.md.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

func usage() {
	fmt.Fprintln(os.Stderr, "usage: demo up|down|serve [--dir DIR]")
	os.Exit(2)
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	dir := fs.String("dir", "/var/tmp/cistern-demo", "directory for everything the demo makes")
	_ = fs.Parse(os.Args[2:])
	abs, err := filepath.Abs(*dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	d := demoDir(abs)
	switch os.Args[1] {
	case "up":
		err = up(d)
	case "serve":
		err = serve(d)
	case "down":
		err = down(d)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// demoDir names the files of a demo.
type demoDir string

func (d demoDir) path(name ...string) string {
	return filepath.Join(append([]string{string(d)}, name...)...)
}
func (d demoDir) pidFile() string      { return d.path("demo.pid") }
func (d demoDir) progressFile() string { return d.path("progress") }
func (d demoDir) summaryFile() string  { return d.path("summary.json") }
func (d demoDir) logFile() string      { return d.path("demo.log") }
func (d demoDir) kubeconfig() string   { return d.path("kubeconfig") }

var started = time.Now()

// logf writes to the serving process's log (its stdout).
func logf(format string, args ...any) {
	fmt.Printf("%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}
