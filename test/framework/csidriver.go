package framework

import (
	"net"
	"os"
	"time"
)

// StartCSIDriver runs a CSI driver binary (Cistern's csi-driver) serving CSI on the unix socket
// socket, with args after its --endpoint, and returns once the socket accepts connections; a
// driver that exits first, or is not listening within a minute, fails the test with the end of its
// log. It is stopped when the test ends. Every suite and the demo start the driver here, each with
// the flags of the node it plays.
func StartCSIDriver(t TB, name, bin, socket string, args ...string) *Process {
	t.Helper()
	_ = os.Remove(socket) // a previous run's (a restart)
	p := StartProcess(t, name, bin, append([]string{"--endpoint=unix://" + socket}, args...)...)
	deadline := time.Now().Add(time.Minute)
	for {
		if c, err := net.Dial("unix", socket); err == nil {
			c.Close()
			return p
		}
		select {
		case <-p.Done():
			t.Fatalf("%s exited: %v; last lines of %s:\n%s", p.Name, p.Err(), p.LogPath, Tail(p.LogPath, 20))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s not listening after 1m; last lines of %s:\n%s", p.Name, socket, p.LogPath, Tail(p.LogPath, 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
