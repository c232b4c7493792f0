package registration

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"failure case - no driver name", Config{Endpoint: "/csi/csi.sock"}},
		{"failure case - no endpoint", Config{DriverName: "d"}},
		{"failure case - relative endpoint", Config{DriverName: "d", Endpoint: "csi.sock"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.cfg); err == nil {
				t.Fatal("New succeeded")
			}
		})
	}
	s, err := New(Config{DriverName: "cistern.csi.dev", Endpoint: "/csi/csi.sock"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "/var/lib/kubelet/plugins_registry/cistern.csi.dev-reg.sock"; s.SocketPath() != want {
		t.Errorf("socket path %q, want %q", s.SocketPath(), want)
	}
}

// kubelet plays kubelet's plugin watcher against the socket.
func kubelet(t *testing.T, socket string) registerapi.RegistrationClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return registerapi.NewRegistrationClient(conn)
}

// startServer runs a Server until the test ends; stop ends it early and returns Run's error.
func startServer(t *testing.T, cfg Config) (s *Server, stop func() error) {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	stop = sync.OnceValue(func() error {
		cancel()
		return <-errc
	})
	t.Cleanup(func() { _ = stop() })
	// Dialed, not stat'ed: a stale file may sit at the path until the server replaces it.
	waitFor(t, "registration socket", func() bool {
		conn, err := net.Dial("unix", s.SocketPath())
		if err != nil {
			return false
		}
		conn.Close()
		return true
	})
	return s, stop
}

func TestRegistration(t *testing.T) {
	dir := t.TempDir()
	// A stale socket from a previous run must not stop the server.
	if err := os.WriteFile(filepath.Join(dir, "cistern.csi.dev-reg.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	endpoint := "/var/lib/kubelet/plugins/cistern.csi.dev/csi.sock"
	s, stop := startServer(t, Config{DriverName: "cistern.csi.dev", Endpoint: endpoint, Dir: dir})
	client := kubelet(t, s.SocketPath())
	ctx := context.Background()

	info, err := client.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatalf("GetInfo: %v", err)
	}
	if info.Type != registerapi.CSIPlugin || info.Name != "cistern.csi.dev" || info.Endpoint != endpoint ||
		len(info.SupportedVersions) == 0 {
		t.Errorf("GetInfo = %+v", info)
	}

	if ok, _ := s.Registered(); ok {
		t.Error("registered before kubelet said so")
	}
	if _, err := client.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatalf("NotifyRegistrationStatus: %v", err)
	}
	if ok, msg := s.Registered(); !ok || msg != "" {
		t.Errorf("Registered() = %v, %q after success", ok, msg)
	}

	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := os.Stat(s.SocketPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket still there after stop (%v): kubelet would not deregister the driver", err)
	}
}

// A refused registration re-creates the socket, which makes kubelet's watcher try again.
func TestRefusedRegistrationOffersAgain(t *testing.T) {
	dir := t.TempDir()
	s, _ := startServer(t, Config{DriverName: "cistern.csi.dev", Endpoint: "/csi.sock", Dir: dir})
	before, err := os.Stat(s.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	client := kubelet(t, s.SocketPath())
	if _, err := client.NotifyRegistrationStatus(context.Background(), &registerapi.RegistrationStatus{
		PluginRegistered: false, Error: "NodeGetInfo failed",
	}); err != nil {
		t.Fatalf("NotifyRegistrationStatus: %v", err)
	}
	if ok, msg := s.Registered(); ok || msg != "NodeGetInfo failed" {
		t.Errorf("Registered() = %v, %q after refusal", ok, msg)
	}
	waitFor(t, "a new registration socket", func() bool {
		// A file system may give the new socket the old one's inode: its time tells it apart
		// (made at least a second later).
		after, err := os.Stat(s.SocketPath())
		return err == nil && (!os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime()))
	})
	// The new socket serves.
	if _, err := kubelet(t, s.SocketPath()).GetInfo(context.Background(), &registerapi.InfoRequest{}); err != nil {
		t.Fatalf("GetInfo on the new socket: %v", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
