// Package registration registers a CSI driver with kubelet's plugin watcher, the job
// node-driver-registrar does in a sidecar container.
//
// kubelet watches its plugins_registry directory for sockets. For each new one it calls
// Registration.GetInfo, validates the answer, registers the CSI endpoint named there (calling
// NodeGetInfo, then writing the driver into the CSINode object and the topology labels onto the
// Node), and reports the outcome with NotifyRegistrationStatus. Removing the socket deregisters
// the driver.
//
// Server serves that API on <dir>/<driver>-reg.sock. When kubelet reports a failed registration
// it re-creates the socket after a backoff, so kubelet tries again; node-driver-registrar exits
// instead and relies on its container being restarted.
//
// It is the node-driver-registrar stand-in's (the upstream image is not available to the test
// suites here); the driver does not register itself, deploy/csi runs the upstream registrar.
package registration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// DefaultDir is kubelet's plugin registration directory with its default --root-dir.
const DefaultDir = "/var/lib/kubelet/plugins_registry"

// CSI versions kubelet's CSI plugin handler accepts; it needs one it supports (1.x).
var supportedVersions = []string{"1.0.0"}

const (
	minRetryDelay = time.Second
	maxRetryDelay = time.Minute
	stopTimeout   = 5 * time.Second
)

// Config says what to register and where.
type Config struct {
	// DriverName is the CSI driver name kubelet registers (e.g. cistern.csi.dev).
	DriverName string
	// Endpoint is the CSI socket path as kubelet sees it on the host; for a driver in a container
	// it differs from the path the driver listens on.
	Endpoint string
	// Dir is kubelet's plugins_registry directory (default DefaultDir).
	Dir string
}

// Server serves kubelet's plugin Registration API for one CSI driver.
type Server struct {
	registerapi.UnimplementedRegistrationServer

	cfg        Config
	socketPath string
	// retry receives a value when kubelet reports a failed registration.
	retry chan struct{}

	mu         sync.Mutex
	registered bool
	lastError  string
}

// New validates cfg and returns a Server; Run starts it.
func New(cfg Config) (*Server, error) {
	if cfg.DriverName == "" {
		return nil, errors.New("registration: driver name is required")
	}
	if cfg.Endpoint == "" {
		return nil, errors.New("registration: the CSI endpoint as kubelet sees it is required")
	}
	if !filepath.IsAbs(cfg.Endpoint) {
		return nil, fmt.Errorf("registration: CSI endpoint %q is not an absolute path", cfg.Endpoint)
	}
	if cfg.Dir == "" {
		cfg.Dir = DefaultDir
	}
	return &Server{
		cfg:        cfg,
		socketPath: SocketPath(cfg.Dir, cfg.DriverName),
		retry:      make(chan struct{}, 1),
	}, nil
}

// SocketPath is where a driver's registration socket lives, as node-driver-registrar names it.
func SocketPath(dir, driverName string) string {
	return filepath.Join(dir, driverName+"-reg.sock")
}

// SocketPath is the registration socket this server listens on.
func (s *Server) SocketPath() string { return s.socketPath }

// Registered reports whether kubelet's last notification was a successful registration, and the
// error it sent otherwise.
func (s *Server) Registered() (bool, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.registered, s.lastError
}

// Run serves the Registration API until ctx ends, then removes the socket, which deregisters
// the driver (as node-driver-registrar does on SIGTERM). Start it once the CSI endpoint accepts
// calls: kubelet calls NodeGetInfo as soon as it sees the socket.
func (s *Server) Run(ctx context.Context) error {
	if err := os.MkdirAll(s.cfg.Dir, 0o750); err != nil {
		return fmt.Errorf("registration: creating %s: %w", s.cfg.Dir, err)
	}
	logger := klog.FromContext(ctx).WithValues("socket", s.socketPath)
	delay := minRetryDelay
	for {
		stop, err := s.serve(logger)
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			stop()
			return nil
		case <-s.retry:
			// A new socket is a new plugin to kubelet's watcher: it registers it again.
			stop()
			logger.Info("Kubelet refused the registration; offering it again", "delay", delay)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(delay):
			}
			delay = min(2*delay, maxRetryDelay)
		}
	}
}

// serve listens on a fresh socket and returns a function that stops serving and removes it.
func (s *Server) serve(logger klog.Logger) (stop func(), err error) {
	// A socket left by a previous run would make Listen fail; kubelet already forgot it.
	if err := os.Remove(s.socketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("registration: removing stale socket: %w", err)
	}
	lis, err := net.Listen("unix", s.socketPath)
	if err != nil {
		return nil, fmt.Errorf("registration: %w", err)
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(lis); err != nil {
			logger.Error(err, "Registration server stopped")
		}
	}()
	logger.V(2).Info("Serving kubelet plugin registration", "driver", s.cfg.DriverName, "endpoint", s.cfg.Endpoint)
	return func() {
		// Removed first, so kubelet's watcher deregisters rather than calls a closed socket.
		if err := os.Remove(s.socketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			logger.Error(err, "Removing registration socket")
		}
		// Graceful, so that the answer to a NotifyRegistrationStatus in flight still gets out.
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(stopTimeout):
			srv.Stop()
		}
		<-done
	}, nil
}

// GetInfo tells kubelet which CSI driver this is and where its endpoint is.
func (s *Server) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	klog.FromContext(ctx).V(3).Info("Kubelet asked for plugin info", "driver", s.cfg.DriverName)
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              s.cfg.DriverName,
		Endpoint:          s.cfg.Endpoint,
		SupportedVersions: supportedVersions,
	}, nil
}

// NotifyRegistrationStatus records kubelet's verdict; a refusal schedules another attempt.
func (s *Server) NotifyRegistrationStatus(ctx context.Context, status *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	logger := klog.FromContext(ctx)
	s.mu.Lock()
	s.registered, s.lastError = status.PluginRegistered, status.Error
	s.mu.Unlock()
	if status.PluginRegistered {
		logger.Info("Registered with kubelet", "driver", s.cfg.DriverName)
		return &registerapi.RegistrationStatusResponse{}, nil
	}
	logger.Error(errors.New(status.Error), "Kubelet refused the registration", "driver", s.cfg.DriverName)
	select {
	case s.retry <- struct{}{}:
	default: // a retry is already pending
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
