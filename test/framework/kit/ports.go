package kit

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

var (
	portsMu sync.Mutex
	// handedOut avoids giving the same port twice within one test binary; the kernel may offer a
	// just-closed port again.
	handedOut = map[int]bool{}
)

// FreePort returns a loopback TCP port that was free a moment ago and that this test binary has not
// handed out before. Another process can still take it before the component binds it;
// StartControlPlane retries when that happens. Every suite takes its ports here.
func FreePort() (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if !handedOut[port] {
			handedOut[port] = true
			return port, nil
		}
	}
}

// FreeAddr returns a loopback address ("127.0.0.1:port") with a port from FreePort.
func FreeAddr(t TB) string {
	t.Helper()
	p, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
}

// FreePorts returns n ports from FreePort.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	return ports, nil
}

// ErrExited is WaitListening's error when the server's process ended first.
var ErrExited = errors.New("exited")

// WaitListening waits until addr (host:port) accepts TCP connections: how a test knows that a
// server it started is up. It gives up after timeout, or with ErrExited as soon as exited (closed
// when the server's process ends) is closed.
func WaitListening(addr string, timeout time.Duration, exited <-chan struct{}) error {
	deadline := time.Now().Add(timeout)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return conn.Close()
		}
		select {
		case <-exited:
			return fmt.Errorf("%w before it listened on %s", ErrExited, addr)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening on %s after %s: %w", addr, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
