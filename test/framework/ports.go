package framework

import (
	"net"
	"sync"
)

var (
	portsMu sync.Mutex
	// handedOut avoids giving the same port twice within one test binary; the kernel may offer a
	// just-closed port again.
	handedOut = map[int]bool{}
)

// freePort returns a loopback TCP port that was free a moment ago. Another process can still take
// it before the component binds it; StartControlPlane retries when that happens.
func freePort() (int, error) {
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

func freePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	return ports, nil
}
