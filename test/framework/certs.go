package framework

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"

	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

// credentials are the files kube-apiserver and its clients share.
type credentials struct {
	caCert         []byte // PEM: serving certificate and the CA that signed it
	servingCert    string // file paths
	servingKey     string
	caFile         string
	saSigningKey   string
	saPublicKey    string
	tokenFile      string
	adminToken     string
	kcmToken       string
	schedulerToken string
}

// ServiceClusterIPRange is the API server's --service-cluster-ip-range, where Services' ClusterIPs
// come from.
const ServiceClusterIPRange = "10.0.0.0/24"

// KubernetesServiceIP is the ClusterIP of the default/kubernetes Service: the first address of
// ServiceClusterIPRange.
const KubernetesServiceIP = "10.0.0.1"

// writeCredentials writes a serving certificate for 127.0.0.1/localhost signed by a throwaway CA,
// a service-account signing key pair, and a static token file with one token per client.
func writeCredentials(dir string) (*credentials, error) {
	c := &credentials{
		servingCert:  filepath.Join(dir, "serving.crt"),
		servingKey:   filepath.Join(dir, "serving.key"),
		caFile:       filepath.Join(dir, "ca.crt"),
		saSigningKey: filepath.Join(dir, "sa.key"),
		saPublicKey:  filepath.Join(dir, "sa.pub"),
		tokenFile:    filepath.Join(dir, "tokens.csv"),
	}
	// Also the names pods use for the API server, as a real cluster's certificate has them: the
	// kubernetes Service's ClusterIP (the first address of --service-cluster-ip-range) and its
	// DNS names. The install suite's pods reach the API server there.
	cert, key, err := certutil.GenerateSelfSignedCertKey("127.0.0.1",
		[]net.IP{net.IPv4(127, 0, 0, 1), net.ParseIP(KubernetesServiceIP)},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"})
	if err != nil {
		return nil, fmt.Errorf("generating serving certificate: %w", err)
	}
	// The generated bundle is the serving certificate followed by its CA; clients and
	// --root-ca-file want the CA alone (kube-controller-manager publishes it as a trust bundle).
	certs, err := certutil.ParseCertsPEM(cert)
	if err != nil {
		return nil, err
	}
	for _, crt := range certs {
		if crt.IsCA {
			c.caCert = append(c.caCert, pem.EncodeToMemory(&pem.Block{Type: certutil.CertificateBlockType, Bytes: crt.Raw})...)
		}
	}
	if len(c.caCert) == 0 {
		return nil, fmt.Errorf("generated serving certificate has no CA")
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	saKeyPEM, err := keyutil.MarshalPrivateKeyToPEM(saKey)
	if err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	saPubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})

	for _, tok := range []*string{&c.adminToken, &c.kcmToken, &c.schedulerToken} {
		if *tok, err = randomToken(); err != nil {
			return nil, err
		}
	}
	// token,user,uid,"group1,group2"; the component users get their bootstrap RBAC roles.
	tokens := fmt.Sprintf("%s,admin,admin,system:masters\n%s,system:kube-controller-manager,kcm\n%s,system:kube-scheduler,scheduler\n",
		c.adminToken, c.kcmToken, c.schedulerToken)

	for path, data := range map[string][]byte{
		c.servingCert:  cert,
		c.servingKey:   key,
		c.caFile:       c.caCert,
		c.saSigningKey: saKeyPEM,
		c.saPublicKey:  saPubPEM,
		c.tokenFile:    []byte(tokens),
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func randomToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
