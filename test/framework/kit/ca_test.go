package kit

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"testing"
)

// TestCAIssues: what a CA issues verifies against its CertPEM for the usage asked for (a server
// at 127.0.0.1, a client in groups), and the key matches the certificate.
func TestCAIssues(t *testing.T) {
	ca := NewCA(t, "test CA")
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca.CertPEM) {
		t.Fatal("CertPEM holds no certificate")
	}
	for _, tc := range []struct {
		name  string
		tmpl  *x509.Certificate
		usage x509.ExtKeyUsage
		other x509.ExtKeyUsage
	}{
		{"server", &x509.Certificate{Subject: pkix.Name{CommonName: "s"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		{"client", &x509.Certificate{Subject: pkix.Name{CommonName: "system:node:n", Organization: []string{"system:nodes"}},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	} {
		t.Run(tc.name, func(t *testing.T) {
			certPEM, keyPEM := ca.Issue(t, tc.tmpl)
			cert := parsePair(t, certPEM, keyPEM)
			if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{tc.usage}}); err != nil {
				t.Errorf("does not verify for its usage: %v", err)
			}
			if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{tc.other}}); err == nil {
				t.Error("verifies for a usage it was not issued for")
			}
		})
	}
	t.Run("failure case - another CA's certificate", func(t *testing.T) {
		certPEM, keyPEM := NewCA(t, "another CA").Issue(t, &x509.Certificate{ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		cert := parsePair(t, certPEM, keyPEM)
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
			t.Error("verifies against a CA that did not issue it")
		}
	})
}

// parsePair checks that the key is the certificate's and returns the certificate.
func parsePair(t *testing.T, certPEM, keyPEM []byte) *x509.Certificate {
	t.Helper()
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return cert
}
