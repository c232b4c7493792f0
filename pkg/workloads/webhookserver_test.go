package workloads

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/pkg/workloads/webhookcert"
)

// TestWebhookServerServesMountedCertificate: with --webhook-cert-provisioning=false the webhook
// server serves the tls.crt and tls.key another issuer keeps in --webhook-cert-dir (cert-manager's
// Secret, mounted), and serves the next one once that issuer replaces them.
func TestWebhookServerServesMountedCertificate(t *testing.T) {
	const host = "cistern-workload-webhook.cistern-system.svc"
	dir := t.TempDir()
	first := writeBundle(t, dir, host)
	cfg := Config{WebhookHost: "127.0.0.1", WebhookPort: freePort(t), WebhookCertDir: dir,
		DisableWebhookCertProvisioning: true, WebhookServiceName: "cistern-workload-webhook", GitImage: "git", CompareImage: "c"}
	if err := cfg.validate(); err == nil || !bytes.Contains([]byte(err.Error()), []byte("no API server configuration")) {
		t.Fatalf("validate: %v, want only the missing API server (no Secret name needed)", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	exited := make(chan error, 1)
	go func() { exited <- webhookServer(cfg).Start(ctx) }()

	addr := net.JoinHostPort(cfg.WebhookHost, strconv.Itoa(cfg.WebhookPort))
	if got := servedUntil(t, addr, host, first, exited, 100); !bytes.Equal(got, first.leaf) {
		t.Fatal("the server does not serve the mounted certificate")
	}
	// The issuer renews: the server picks the new pair up without a restart.
	second := writeBundle(t, dir, host)
	if got := servedUntil(t, addr, host, second, exited, 300); !bytes.Equal(got, second.leaf) {
		t.Fatal("the server kept the old certificate after the mounted one was replaced")
	}
}

type served struct {
	pool *x509.CertPool
	leaf []byte // DER
}

// writeBundle issues a CA and a serving certificate for host into dir, as a mounted
// kubernetes.io/tls Secret holds them, each file replaced by a rename.
func writeBundle(t *testing.T, dir, host string) served {
	t.Helper()
	b, err := webhookcert.Renew(webhookcert.Bundle{}, []string{host}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{webhookcert.KeyKey: b.Key, webhookcert.CertKey: b.Cert, webhookcert.CACertKey: b.CACert} {
		tmp := filepath.Join(dir, "."+name)
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	pair, err := tls.X509KeyPair(b.Cert, b.Key)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b.CACert)
	return served{pool: pool, leaf: pair.Certificate[0]}
}

// servedUntil dials addr up to attempts times, 100 ms apart, until the server presents want's
// certificate verified for host against want's CA; it returns the last certificate presented.
func servedUntil(t *testing.T, addr, host string, want served, exited <-chan error, attempts int) []byte {
	t.Helper()
	var last []byte
	for i := 0; i < attempts; i++ {
		select {
		case err := <-exited:
			t.Fatalf("the webhook server exited: %v", err)
		default:
		}
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: want.pool, ServerName: host})
		if err == nil {
			last = conn.ConnectionState().PeerCertificates[0].Raw
			conn.Close()
			if bytes.Equal(last, want.leaf) {
				return last
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return last
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
