// Package webhookcert provisions the workload-controller's admission webhooks with certificates
// it manages itself: a CA and a serving certificate generated on first start, kept in a Secret,
// renewed before they expire, and the CA injected into the webhook configurations' caBundle
// (certs.go, configurations.go). No cert-manager needed. The webhooks themselves are served by
// the packages that own them (lws, notebook, placement).
package webhookcert

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// Keys of the certificate Secret (the kubernetes.io/tls layout plus the CA).
const (
	CACertKey = "ca.crt"
	CAKeyKey  = "ca.key"
	CertKey   = "tls.crt"
	KeyKey    = "tls.key"
)

// Lifetimes: the serving certificate is renewed when a third of its life is left, the CA when it
// could no longer cover a fresh serving certificate.
const (
	caLifetime      = 10 * 365 * 24 * time.Hour
	servingLifetime = 365 * 24 * time.Hour
)

// Bundle is a CA and a serving certificate signed by it, PEM encoded.
type Bundle struct {
	CACert, CAKey, Cert, Key []byte
}

// FromSecretData reads a bundle from a Secret's data; missing keys leave fields empty.
func FromSecretData(d map[string][]byte) Bundle {
	return Bundle{CACert: d[CACertKey], CAKey: d[CAKeyKey], Cert: d[CertKey], Key: d[KeyKey]}
}

// SecretData is the Secret form of a bundle.
func (b Bundle) SecretData() map[string][]byte {
	return map[string][]byte{CACertKey: b.CACert, CAKeyKey: b.CAKey, CertKey: b.Cert, KeyKey: b.Key}
}

// NeedsRenewal says why the bundle cannot be used as is for hosts at now ("" when it can): a
// part missing or unparsable, a certificate not signed by the CA, not covering every host, or
// within the last third of its life.
func (b Bundle) NeedsRenewal(hosts []string, now time.Time) string {
	ca, err := parseCert(b.CACert)
	if err != nil {
		return "CA: " + err.Error()
	}
	if _, err := parseKey(b.CAKey); err != nil {
		return "CA key: " + err.Error()
	}
	cert, err := parseCert(b.Cert)
	if err != nil {
		return "serving certificate: " + err.Error()
	}
	if _, err := parseKey(b.Key); err != nil {
		return "serving key: " + err.Error()
	}
	if err := cert.CheckSignatureFrom(ca); err != nil {
		return "serving certificate not signed by the CA"
	}
	for _, h := range hosts {
		if err := cert.VerifyHostname(h); err != nil {
			return "serving certificate does not cover " + h
		}
	}
	if renewAt(cert).Before(now) {
		return "serving certificate expires " + cert.NotAfter.Format(time.RFC3339)
	}
	if ca.NotAfter.Before(now.Add(servingLifetime)) {
		return "CA expires " + ca.NotAfter.Format(time.RFC3339)
	}
	return ""
}

func renewAt(c *x509.Certificate) time.Time {
	life := c.NotAfter.Sub(c.NotBefore)
	return c.NotAfter.Add(-life / 3)
}

// Renew returns a bundle valid for hosts: it keeps a CA that can still sign (so caBundles already
// injected stay valid) and issues a new serving certificate; a CA near its end is replaced too.
func Renew(old Bundle, hosts []string, now time.Time) (Bundle, error) {
	var caCert *x509.Certificate
	var caKey *ecdsa.PrivateKey
	if c, err := parseCert(old.CACert); err == nil && !c.NotAfter.Before(now.Add(servingLifetime)) {
		if k, err := parseKey(old.CAKey); err == nil {
			caCert, caKey = c, k
		}
	}
	b := old
	if caCert == nil {
		var err error
		if caCert, caKey, b.CACert, b.CAKey, err = newCA(now); err != nil {
			return Bundle{}, err
		}
	}
	var err error
	b.Cert, b.Key, err = newServing(caCert, caKey, hosts, now)
	return b, err
}

func newCA(now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, []byte, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: fmt.Sprintf("cistern-workload-controller-ca@%d", now.Unix())},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	keyPEM, err := encodeKey(key)
	return cert, key, encodeCert(der), keyPEM, err
}

func newServing(ca *x509.Certificate, caKey *ecdsa.PrivateKey, hosts []string, now time.Time) ([]byte, []byte, error) {
	if len(hosts) == 0 {
		return nil, nil, errors.New("no host names for the serving certificate")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: hosts[0]},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(servingLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := encodeKey(key)
	return encodeCert(der), keyPEM, err
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return n
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func encodeKey(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func parseCert(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(blk.Bytes)
}

func parseKey(b []byte) (*ecdsa.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "EC PRIVATE KEY" {
		return nil, errors.New("no PEM EC private key")
	}
	return x509.ParseECPrivateKey(blk.Bytes)
}

// sameBundle compares the parts that matter to the server and the caBundle.
func sameBundle(a, b Bundle) bool {
	return bytes.Equal(a.CACert, b.CACert) && bytes.Equal(a.Cert, b.Cert) && bytes.Equal(a.Key, b.Key)
}
