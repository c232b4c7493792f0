package testpoint

import (
	"bufio"
	"net"
	"path/filepath"
	"testing"
)

func TestReachOff(t *testing.T) {
	socket = ""
	Reach(TreeMounted, "vol") // returns: no socket, nothing to wait for
}

// With the socket, Reach reports the point and does not return before the answer.
func TestReachWaitsForTheAnswer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "points.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	socket = path
	defer func() { socket = "" }()
	returned := make(chan struct{})
	go func() {
		Reach(TreeUnmounted, "vol-1")
		close(returned)
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != TreeUnmounted+" vol-1\n" {
		t.Fatalf("reported %q, %v", line, err)
	}
	select {
	case <-returned:
		t.Fatal("Reach returned before the answer")
	default:
	}
	if _, err := c.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	<-returned
}
