package s3source

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"strings"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// TLS is how the client trusts its endpoint.
type TLS struct {
	// RootCAs verify the endpoint's certificate instead of the system's roots (a private CA's
	// bundle); nil uses the system's.
	RootCAs *x509.CertPool
	// AllowPlainHTTP lets an http:// endpoint that is not a loopback address through. Without
	// it such an endpoint is refused: the keys, the signatures and every byte of the dataset
	// would cross the network in the clear, and anything on the path could change the data.
	AllowPlainHTTP bool
}

// checkEndpoint refuses a plain-HTTP endpoint off the node unless allowed. AWS (no endpoint) is
// HTTPS.
func (t TLS) checkEndpoint(endpoint string) error {
	if endpoint == "" || t.AllowPlainHTTP {
		return nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || !strings.EqualFold(u.Scheme, "http") || isLoopback(u.Hostname()) {
		return nil
	}
	return source.Errorf(source.Denied, "endpoint %s is plain HTTP: use https, or start the driver with --s3-allow-plain-http", endpoint)
}

// isLoopback is true for loopback addresses and "localhost", which never leave the node.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// clientConfig is the transport's TLS configuration.
func (t TLS) clientConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: t.RootCAs}
}

// ParseCABundle reads a PEM bundle of CA certificates; one without any certificate is an error,
// so that a wrong file does not silently mean "trust nothing".
func ParseCABundle(name string, pem []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, source.Errorf(source.Invalid, "CA bundle %q holds no PEM certificate", name)
	}
	return pool, nil
}

// untrusted classifies a certificate the client could not verify (unknown CA, wrong name,
// expired): a configuration error that retrying does not fix.
func untrusted(err error, msg string) (error, bool) {
	var cv *tls.CertificateVerificationError
	if !errors.As(err, &cv) {
		return nil, false
	}
	return source.Wrap(source.Invalid, cv.Err, "%s: the endpoint's certificate is not trusted (a private CA: name its bundle with the caBundle parameter)", msg), true
}
