package driver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/consts"
	spv1 "github.com/cistern-csi/cistern/pkg/rpc/storagepool/v1alpha1"
)

type server struct {
	grpc *grpc.Server
}

func (d *Driver) newServer() (*server, error) {
	g := grpc.NewServer(grpc.ChainUnaryInterceptor(d.logAndMeasure, d.lockRequest), grpc.StreamInterceptor(d.logStream))
	csi.RegisterIdentityServer(g, &identityServer{d: d})
	if d.cfg.Mode == ModeAll || d.cfg.Mode == ModeController {
		csi.RegisterControllerServer(g, &controllerServer{d: d})
		csi.RegisterGroupControllerServer(g, &groupControllerServer{d: d})
	}
	if d.cfg.Mode == ModeAll || d.cfg.Mode == ModeNode {
		csi.RegisterNodeServer(g, &nodeServer{d: d})
	}
	spv1.RegisterStoragePoolControllerServer(g, &poolServer{d: d})
	reflection.Register(g)
	return &server{grpc: g}, nil
}

// serve listens on a unix socket endpoint until ctx ends, then drains in-flight calls for at most
// timeout before closing them.
func (s *server) serve(ctx context.Context, endpoint string, timeout time.Duration, listening func()) error {
	path, err := socketPath(endpoint)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing stale socket %s: %w", path, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", path, err)
	}
	klog.InfoS("Serving CSI", "endpoint", endpoint)
	listening()
	errc := make(chan error, 1)
	go func() { errc <- s.grpc.Serve(lis) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	klog.InfoS("Stopping: draining in-flight calls", "timeout", timeout)
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		klog.InfoS("Drain timed out; closing remaining calls")
		s.grpc.Stop()
	}
	// Serve closes the listener, which unlinks the socket, when it returns: when ctx ended before
	// it began serving, that is after GracefulStop. Waiting for it keeps a late unlink from
	// removing the socket of the next server on the same path (a restart in the same process).
	<-errc
	_ = os.Remove(path)
	return nil
}

func socketPath(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", fmt.Errorf("invalid endpoint %q: %w", endpoint, err)
	}
	if u.Scheme != "unix" {
		return "", fmt.Errorf("endpoint %q: only unix:// sockets are supported", endpoint)
	}
	path := u.Path
	if path == "" {
		path = u.Host // unix://relative/path
	} else if u.Host != "" {
		path = filepath.Join(u.Host, path)
	}
	if path == "" {
		return "", fmt.Errorf("endpoint %q has no path", endpoint)
	}
	return path, nil
}

// logAndMeasure logs every call with its duration and error (payloads only at V(5), secrets
// stripped), records Prometheus metrics, and makes sure no plain error leaves as Unknown.
func (d *Driver) logAndMeasure(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	logger := klog.FromContext(ctx).WithValues("method", info.FullMethod)
	ctx = klog.NewContext(ctx, logger)
	logger.V(5).Info("Request", "request", sanitized(req))
	start := time.Now()
	var resp any
	err := d.checkRequest(req)
	if err == nil {
		resp, err = handler(ctx, req)
	}
	elapsed := time.Since(start)
	if err != nil {
		if _, ok := status.FromError(err); !ok {
			err = status.Error(codes.Internal, err.Error())
		}
	}
	d.metrics.RecordMetrics(info.FullMethod, err, elapsed)
	if err != nil {
		logger.V(2).Info("Call failed", "duration", elapsed, "err", err)
	} else {
		logger.V(3).Info("Call succeeded", "duration", elapsed)
		logger.V(5).Info("Response", "response", protosanitizer.StripSecrets(resp))
	}
	return resp, err
}

// sanitized is a request as the log shows it: protosanitizer strips the fields the CSI spec
// marks csi_secret, but the pod's ServiceAccount tokens kubelet puts in NodePublishVolume's
// volume context (the CSIDriver's tokenRequests) are credentials in a field that is not one.
func sanitized(req any) fmt.Stringer {
	type withContext interface{ GetVolumeContext() map[string]string }
	if r, ok := req.(withContext); ok {
		if _, tokens := r.GetVolumeContext()[consts.VolumeContextSATokens]; tokens {
			if m, ok := req.(proto.Message); ok {
				c := proto.Clone(m)
				// The clone's map is its own: the request handed on keeps its tokens.
				c.(withContext).GetVolumeContext()[consts.VolumeContextSATokens] = "***stripped***"
				req = c
			}
		}
	}
	return protosanitizer.StripSecrets(req)
}

func (d *Driver) logStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	logger := klog.FromContext(ss.Context()).WithValues("method", info.FullMethod)
	logger.V(3).Info("Stream opened")
	err := handler(srv, ss)
	logger.V(3).Info("Stream closed", "err", err)
	return err
}
