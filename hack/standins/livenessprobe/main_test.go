package main

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

type identity struct {
	csi.UnimplementedIdentityServer
	ready *atomic.Bool
}

func (i identity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(i.ready.Load())}, nil
}

// /healthz follows the driver's Probe: 200 when ready, 500 when not ready or gone.
func TestLivenessProbe(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var ready atomic.Bool
	ready.Store(true)
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, identity{ready: &ready})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, sock, addr, time.Second) }()
	defer func() {
		cancel()
		<-done
	}()

	get := func() int {
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, err := http.Get("http://" + addr + "/healthz")
			if err == nil {
				resp.Body.Close()
				return resp.StatusCode
			}
			if time.Now().After(deadline) {
				t.Fatalf("/healthz: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if code := get(); code != http.StatusOK {
		t.Errorf("ready driver: /healthz = %d, want 200", code)
	}
	ready.Store(false)
	if code := get(); code != http.StatusInternalServerError {
		t.Errorf("driver not ready: /healthz = %d, want 500", code)
	}
	srv.Stop()
	if code := get(); code != http.StatusInternalServerError {
		t.Errorf("driver gone: /healthz = %d, want 500", code)
	}
}
