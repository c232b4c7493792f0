// Package testpoint names points inside the driver's calls at which a fault test holds the
// process, to SIGKILL it exactly there rather than at a moment a timer guesses (test/chaos).
//
// It does nothing unless the process starts with CISTERN_TESTPOINT_SOCKET naming a unix socket
// in its environment, which no deployment sets: then Reach tells the socket "<point> <subject>"
// and waits for one line back. The test answers at once to let the call go on, or never, and
// kills the process while the call waits there.
package testpoint

import (
	"bufio"
	"net"
	"os"
)

// EnvSocket is the variable that turns the points on.
const EnvSocket = "CISTERN_TESTPOINT_SOCKET"

// The points, in the order a call passes them.
const (
	// Dataset staging (pkg/datasource/stage): a file of the dataset is in place in the staging
	// directory; the staging directory is synced, just before it becomes the version's tree.
	StagingFileCommitted = "staging-file-committed"
	StagingSynced        = "staging-synced"
	// A read-only inline volume served from the cache (pkg/volume tree.go): its reference is
	// recorded; the cache holds it for the volume; it is mounted at the target.
	TreeReferenced = "tree-referenced"
	TreeServed     = "tree-served"
	TreeMounted    = "tree-mounted"
	// Its release at NodeUnpublish: the target is unmounted; the cache's reference is dropped.
	TreeUnmounted = "tree-unmounted"
	TreeUnserved  = "tree-unserved"
	// An image volume's NodeStage (pkg/volume image.go): attached to a loop device; its
	// filesystem mounted at the staging path; filled (or layered) from its dataset.
	ImageAttached = "image-attached"
	ImageMounted  = "image-mounted"
	ImageFilled   = "image-filled"
)

var socket = os.Getenv(EnvSocket)

// Reach reports that the call reached point, for subject (a volume or dataset ID), and waits
// for the test's answer. Without the socket it returns at once.
func Reach(point, subject string) {
	if socket == "" {
		return
	}
	conn, err := net.Dial("unix", socket)
	if err != nil {
		return // the test is gone: go on
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(point + " " + subject + "\n")); err != nil {
		return
	}
	_, _ = bufio.NewReader(conn).ReadString('\n')
}
