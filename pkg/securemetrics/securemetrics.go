// Package securemetrics serves a metrics handler over HTTPS to callers the API server
// authenticates (TokenReview) and authorises for the request's non-resource URL
// (SubjectAccessReview: get /metrics): the node plugin's --metrics-secure-address, and the filter
// of the workload-controller's metrics server (--metrics-secure).
package securemetrics

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"
)

// Server is an HTTPS listener whose handler only authorised callers reach.
type Server struct {
	srv *http.Server
	lis net.Listener
}

// New listens on addr (host:port) and guards handler with TokenReview and SubjectAccessReview
// through rc. The certificate is self-signed for host, made afresh at each start (as
// controller-runtime's when given no certificate directory): scrapers check who they talk to by
// the network, the server checks who reads.
func New(ctx context.Context, addr, host string, rc *rest.Config, handler http.Handler) (*Server, error) {
	httpClient, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, err
	}
	filter, err := WithAuthenticationAndAuthorization(rc, httpClient)
	if err != nil {
		return nil, err
	}
	guarded, err := filter(klog.FromContext(ctx).WithName("metrics"), handler)
	if err != nil {
		return nil, err
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(host, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("metrics certificate: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("metrics certificate: %w", err)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{
		Handler:           guarded,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}},
	}
	return &Server{srv: srv, lis: lis}, nil
}

// Addr is the address the server listens at.
func (s *Server) Addr() net.Addr { return s.lis.Addr() }

// Serve serves until ctx ends, then shuts down within five seconds.
func (s *Server) Serve(ctx context.Context) error {
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.srv.Shutdown(shutdown)
	}()
	if err := s.srv.ServeTLS(s.lis, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
