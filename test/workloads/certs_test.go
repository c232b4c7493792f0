package workloads_test

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/workloads/webhookcert"
	"github.com/cistern-csi/cistern/test/workloads/testutil"
)

// TestWebhookCertificates: in Service mode the controller issues its certificate into a Secret,
// writes it for the server and injects the CA into the installed configurations; a damaged
// serving certificate is reissued under the same CA, a lost CA replaced and re-injected, and a
// second replica reuses what the first stored.
func TestWebhookCertificates(t *testing.T) {
	_, ns, ctx := setupNamespace(t, "certs")
	name := "cert-test-" + ns

	// The configurations as deploy/ installs them (no caBundle), matching nothing, so they cannot
	// disturb the other tests.
	m, v := webhookcert.Configurations(webhookcert.ServiceClientConfig(ns, "svc", 443), nil, v1alpha1.GroupVersion,
		&webhookcert.PodPlacement{InstallNamespace: ns, DriverName: consts.DriverName})
	m.Name, v.Name = name, name
	never := &metav1.LabelSelector{MatchLabels: map[string]string{"test.cistern.dev/never": "true"}}
	for i := range m.Webhooks {
		m.Webhooks[i].ObjectSelector = never
	}
	for i := range v.Webhooks {
		v.Webhooks[i].ObjectSelector = never
	}
	for _, o := range []client.Object{m, v} {
		if err := cl.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Delete(testutil.Context(t), o) })
	}

	host := "svc." + ns + ".svc"
	dir := t.TempDir()
	p := &webhookcert.CertProvisioner{Client: cl, Namespace: ns, SecretName: "webhook-cert", Hosts: []string{host, host + ".cluster.local"},
		CertDir: dir, ConfigurationName: name}
	check := func() (ca []byte) {
		t.Helper()
		if err := p.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
		var s corev1.Secret
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: "webhook-cert"}, &s); err != nil {
			t.Fatal(err)
		}
		ca = s.Data[webhookcert.CACertKey]
		crt, err := os.ReadFile(filepath.Join(dir, webhookcert.CertKey))
		if err != nil || !bytes.Equal(crt, s.Data[webhookcert.CertKey]) {
			t.Fatalf("served certificate differs from the Secret's: %v", err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		blk, _ := pem.Decode(crt)
		leaf, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: host}); err != nil {
			t.Fatalf("served certificate: %v", err)
		}
		var gm admissionregistrationv1.MutatingWebhookConfiguration
		var gv admissionregistrationv1.ValidatingWebhookConfiguration
		if err := cl.Get(ctx, client.ObjectKey{Name: name}, &gm); err != nil {
			t.Fatal(err)
		}
		if err := cl.Get(ctx, client.ObjectKey{Name: name}, &gv); err != nil {
			t.Fatal(err)
		}
		for _, w := range gm.Webhooks {
			if !bytes.Equal(w.ClientConfig.CABundle, ca) || w.ClientConfig.Service == nil {
				t.Fatalf("mutating webhook %s: caBundle not injected or clientConfig changed", w.Name)
			}
		}
		for _, w := range gv.Webhooks {
			if !bytes.Equal(w.ClientConfig.CABundle, ca) {
				t.Fatalf("validating webhook %s: caBundle not injected", w.Name)
			}
		}
		return ca
	}
	ca1 := check()

	secret := func(mod func(map[string][]byte)) {
		t.Helper()
		var s corev1.Secret
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: "webhook-cert"}, &s); err != nil {
			t.Fatal(err)
		}
		mod(s.Data)
		if err := cl.Update(ctx, &s); err != nil {
			t.Fatal(err)
		}
	}
	// A replica starting later reuses the stored bundle: the Secret is not written again.
	var before corev1.Secret
	_ = cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: "webhook-cert"}, &before)
	other := *p
	other.CertDir = t.TempDir()
	if err := other.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	var after corev1.Secret
	_ = cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: "webhook-cert"}, &after)
	if after.ResourceVersion != before.ResourceVersion {
		t.Error("a second replica rewrote a valid Secret")
	}

	// Damaged serving certificate: reissued under the same CA.
	secret(func(d map[string][]byte) { d[webhookcert.CertKey] = []byte("garbage") })
	if ca2 := check(); !bytes.Equal(ca2, ca1) {
		t.Error("reissuing the serving certificate replaced the CA")
	}
	// Lost CA: a new one, injected into the configurations.
	secret(func(d map[string][]byte) { delete(d, webhookcert.CACertKey); delete(d, webhookcert.CAKeyKey) })
	if ca3 := check(); bytes.Equal(ca3, ca1) {
		t.Error("CA not replaced")
	}
}
