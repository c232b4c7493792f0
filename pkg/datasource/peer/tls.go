package peer

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"math/big"
	"time"
)

// SelfSigned returns a fresh self-signed certificate for the peer port and its SHA-256 (hex). The
// key never leaves the process: a restarted node plugin has a new one, which it publishes anew.
// Peers need no CA: they accept only the certificate the node published on its StoragePools,
// which only node plugins may write.
func SelfSigned(node string) (tls.Certificate, string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "cistern-peer " + node},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, CertHash(der), nil
}

// CertHash is the hex SHA-256 of a DER certificate, as published in AnnotationCertHash.
func CertHash(der []byte) string {
	s := sha256.Sum256(der)
	return hex.EncodeToString(s[:])
}

// pinned is a client TLS config that accepts exactly the certificate whose hash is want.
func pinned(want string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// The chain is not checked against a CA: the certificate is pinned below instead.
		InsecureSkipVerify: true, //nolint:gosec // pinned by VerifyPeerCertificate
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || CertHash(raw[0]) != want {
				return errors.New("the peer's certificate is not the one it published")
			}
			return nil
		},
	}
}
