package webhookcert

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"
	"time"
)

func TestBundleLifecycle(t *testing.T) {
	hosts := []string{"svc.ns.svc", "127.0.0.1"}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	if why := (Bundle{}).NeedsRenewal(hosts, now); !strings.Contains(why, "CA") {
		t.Fatalf("empty bundle: %q", why)
	}
	b, err := Renew(Bundle{}, hosts, now)
	if err != nil {
		t.Fatal(err)
	}
	if why := b.NeedsRenewal(hosts, now); why != "" {
		t.Fatalf("fresh bundle needs renewal: %s", why)
	}
	// The pair loads as a TLS certificate and verifies against the CA for both hosts.
	pair, err := tls.X509KeyPair(b.Cert, b.Key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(pair.Certificate[0])
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b.CACert)
	for _, h := range hosts {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: h, CurrentTime: now}); err != nil {
			t.Errorf("verify for %s: %v", h, err)
		}
	}

	if why := b.NeedsRenewal([]string{"other.host"}, now); !strings.Contains(why, "does not cover other.host") {
		t.Errorf("new host: %q", why)
	}
	// Two thirds into its life the serving certificate is renewed, under the same CA.
	later := now.Add(250 * 24 * time.Hour)
	if why := b.NeedsRenewal(hosts, later); !strings.Contains(why, "serving certificate expires") {
		t.Fatalf("aged bundle: %q", why)
	}
	r, err := Renew(b, hosts, later)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.CACert, b.CACert) || bytes.Equal(r.Cert, b.Cert) {
		t.Error("renewal must keep the CA and replace the serving certificate")
	}
	// Near the CA's end, the CA is replaced too.
	end := now.Add(caLifetime - 100*24*time.Hour)
	if why := r.NeedsRenewal(hosts, end); why == "" {
		t.Fatal("CA near its end not renewed")
	}
	r2, err := Renew(r, hosts, end)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(r2.CACert, r.CACert) {
		t.Error("CA near its end was kept")
	}
	if why := r2.NeedsRenewal(hosts, end); why != "" {
		t.Errorf("renewed bundle: %s", why)
	}
	// A serving certificate from another CA is refused.
	mixed := r2
	mixed.Cert, mixed.Key = b.Cert, b.Key
	if why := mixed.NeedsRenewal(hosts, now); why != "serving certificate not signed by the CA" {
		t.Errorf("mixed bundle: %q", why)
	}
}
