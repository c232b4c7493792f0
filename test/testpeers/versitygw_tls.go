package testpeers

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"net/http"
	"testing"

	"github.com/cistern-csi/cistern/test/framework/kit"
)

// TLSS3 is versitygw serving HTTPS with a certificate of its own private CA.
type TLSS3 struct {
	*S3
	// CAPEM is the CA's certificate, the bundle a client needs to trust the server.
	CAPEM []byte
}

// StartS3TLS starts versitygw on loopback over HTTPS, its certificate (for 127.0.0.1 and
// localhost) issued by a CA made for this test; s.Client trusts that CA.
func StartS3TLS(t testing.TB, dir string) *TLSS3 {
	t.Helper()
	ca := kit.NewCA(t, "cistern test S3 CA")
	certPEM, keyPEM := ca.Issue(t, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "s3"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	})
	cert, key := kit.WritePair(t, t.TempDir(), "tls", certPEM, keyPEM)
	s := startS3(t, dir, []string{cert, key})
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM)
	s.Client = s.newClient(s.Endpoint, &http.Transport{MaxIdleConnsPerHost: 64, TLSClientConfig: &tls.Config{RootCAs: roots}})
	return &TLSS3{S3: s, CAPEM: ca.CertPEM}
}
