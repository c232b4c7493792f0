package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type identity struct {
	csi.UnimplementedIdentityServer
}

func (identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: "test.csi.dev", VendorVersion: "v1"}, nil
}

// A driver socket in, a registration socket out that tells kubelet the driver's name and the
// host path of its socket; /healthz is 200; cancelling removes the socket.
func TestRegistrar(t *testing.T) {
	dir := t.TempDir()
	csiSock := filepath.Join(dir, "csi.sock")
	lis, err := net.Listen("unix", csiSock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, identity{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	healthAddr := l.Addr().String()
	l.Close()
	regDir := filepath.Join(dir, "registry")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, csiSock, "/var/lib/kubelet/plugins/test.csi.dev/csi.sock", regDir, healthAddr, "registration", time.Second)
	}()

	regSock := filepath.Join(regDir, "test.csi.dev-reg.sock")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(regSock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no registration socket %s", regSock)
		}
		time.Sleep(50 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix://"+regSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "test.csi.dev" || info.Endpoint != "/var/lib/kubelet/plugins/test.csi.dev/csi.sock" || info.Type != registerapi.CSIPlugin {
		t.Errorf("GetInfo = %+v", info)
	}
	var code int
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + healthAddr + "/healthz"); err == nil {
			code = resp.StatusCode
			resp.Body.Close()
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code != http.StatusOK {
		t.Errorf("/healthz = %d, want 200", code)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(regSock); !os.IsNotExist(err) {
		t.Errorf("registration socket left after stop: %v", err)
	}
}

func TestRegistrarRefusesOtherModes(t *testing.T) {
	if err := run(context.Background(), "/nonexistent", "/x", t.TempDir(), "", "kubelet-registration-probe", time.Second); err == nil {
		t.Error("--mode=kubelet-registration-probe accepted")
	}
}
