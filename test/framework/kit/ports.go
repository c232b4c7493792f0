package kit

import (
	"net"
	"strconv"
	"sync"
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
