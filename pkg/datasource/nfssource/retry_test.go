package nfssource

import (
	"errors"
	"net"
	"testing"
)

// TestRetryAddrInUse: a dial whose local port is taken (the error the client library returns)
// is tried again; other errors are not.
func TestRetryAddrInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr)
	// The error a dial from a local port already in use gives.
	_, inUse := net.DialTCP("tcp", taken, taken)
	if inUse == nil {
		t.Fatal("dialing from a port in use succeeded")
	}

	calls := 0
	got, err := RetryAddrInUse(func() (int, error) {
		calls++
		if calls < 3 {
			return 0, inUse
		}
		return 42, nil
	})
	if err != nil || got != 42 || calls != 3 {
		t.Errorf("after two ports in use: %d, %v, %d calls; want 42, nil, 3 calls", got, err, calls)
	}

	calls = 0
	if _, err := RetryAddrInUse(func() (int, error) { calls++; return 0, inUse }); err == nil || calls != 8 {
		t.Errorf("always in use: %v after %d calls, want the error after 8", err, calls)
	}

	calls = 0
	refused := errors.New("connection refused")
	if _, err := RetryAddrInUse(func() (int, error) { calls++; return 0, refused }); err != refused || calls != 1 {
		t.Errorf("another error: %v after %d calls, want it at once", err, calls)
	}
}
