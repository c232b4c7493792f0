package webhookcert

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	workloadsv1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

// CertProvisioner keeps the webhook server's certificate valid: it stores the bundle in a Secret
// (shared by every replica), writes the serving pair where the server reads it (the server
// reloads it on change), and puts the CA into the webhook configurations.
type CertProvisioner struct {
	// Client must read from the API server directly: this runs before any cache exists.
	Client client.Client
	// Namespace and SecretName locate the certificate Secret.
	Namespace, SecretName string
	// Hosts are the names (or IPs) the API server dials.
	Hosts []string
	// CertDir receives tls.crt and tls.key.
	CertDir string
	// SelfRegister creates the webhook configurations (URL mode) instead of only injecting the CA
	// into configurations installed with the controller.
	SelfRegister bool
	// ClientConfig says how the API server reaches the server (used when SelfRegister).
	ClientConfig ClientConfigFunc
	// LeaderWorkerSetAPI is the group and version LeaderWorkerSet is served under (for the rules of
	// self-registered configurations); workloads.cistern.dev/v1alpha1 when empty.
	LeaderWorkerSetAPI schema.GroupVersion
	// PodPlacement adds the pod placement webhook to self-registered configurations; nil leaves
	// it out.
	PodPlacement *PodPlacement
	// ConfigurationName names the webhook configurations; ConfigurationName when empty.
	ConfigurationName string
	// Interval between checks; one hour when zero.
	Interval time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

func (p *CertProvisioner) configurationName() string {
	if p.ConfigurationName != "" {
		return p.ConfigurationName
	}
	return ConfigurationName
}

func (p *CertProvisioner) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

// Ensure makes the Secret, the files and the configurations right once. Run it before the webhook
// server starts.
func (p *CertProvisioner) Ensure(ctx context.Context) error {
	b, err := p.ensureSecret(ctx)
	if err != nil {
		return fmt.Errorf("webhook certificate Secret %s/%s: %w", p.Namespace, p.SecretName, err)
	}
	if err := p.writeFiles(b); err != nil {
		return fmt.Errorf("writing webhook certificate to %s: %w", p.CertDir, err)
	}
	if err := p.ensureConfigurations(ctx, b.CACert); err != nil {
		return fmt.Errorf("webhook configurations: %w", err)
	}
	return nil
}

// Start re-runs Ensure every Interval until ctx ends: renewals, a Secret rotated by another
// replica, or a configuration reinstalled without caBundle are all picked up.
func (p *CertProvisioner) Start(ctx context.Context) error {
	interval := p.Interval
	if interval == 0 {
		interval = time.Hour
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := p.Ensure(ctx); err != nil {
				klog.FromContext(ctx).Error(err, "webhook certificate check failed; retrying at the next interval")
			}
		}
	}
}

// NeedLeaderElection is false: every replica serves webhooks and needs the files.
func (p *CertProvisioner) NeedLeaderElection() bool { return false }

func (p *CertProvisioner) ensureSecret(ctx context.Context) (Bundle, error) {
	logger := klog.FromContext(ctx)
	for attempt := 0; ; attempt++ {
		var s corev1.Secret
		err := p.Client.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: p.SecretName}, &s)
		exists := err == nil
		if err != nil && !apierrors.IsNotFound(err) {
			return Bundle{}, err
		}
		cur := FromSecretData(s.Data)
		why := cur.NeedsRenewal(p.Hosts, p.now())
		if why == "" {
			return cur, nil
		}
		next, err := Renew(cur, p.Hosts, p.now())
		if err != nil {
			return Bundle{}, err
		}
		logger.Info("issuing webhook certificate", "secret", klog.KRef(p.Namespace, p.SecretName), "reason", why,
			"newCA", !bytes.Equal(cur.CACert, next.CACert))
		if exists {
			s.Data = next.SecretData()
			err = p.Client.Update(ctx, &s)
		} else {
			err = p.Client.Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.SecretName},
				Type:       corev1.SecretTypeOpaque,
				Data:       next.SecretData(),
			})
		}
		// Another replica got there first: use what it stored.
		if (apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)) && attempt < 3 {
			continue
		}
		return next, err
	}
}

func (p *CertProvisioner) writeFiles(b Bundle) error {
	if err := os.MkdirAll(p.CertDir, 0o700); err != nil {
		return err
	}
	cur := Bundle{CACert: b.CACert}
	cur.Cert, _ = os.ReadFile(filepath.Join(p.CertDir, CertKey))
	cur.Key, _ = os.ReadFile(filepath.Join(p.CertDir, KeyKey))
	if sameBundle(cur, b) {
		return nil
	}
	// Key first, then certificate, each by rename, so the server's watcher never sees a torn file.
	for _, f := range []struct {
		name string
		data []byte
	}{{KeyKey, b.Key}, {CertKey, b.Cert}, {CACertKey, b.CACert}} {
		tmp := filepath.Join(p.CertDir, "."+f.name+".tmp")
		if err := os.WriteFile(tmp, f.data, 0o600); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Join(p.CertDir, f.name)); err != nil {
			return err
		}
	}
	return nil
}

// ensureConfigurations creates or updates the whole configurations in self-register mode;
// otherwise it only sets the caBundle of our webhooks in the installed configurations.
func (p *CertProvisioner) ensureConfigurations(ctx context.Context, ca []byte) error {
	if p.SelfRegister {
		api := p.LeaderWorkerSetAPI
		if api.Empty() {
			api = workloadsv1alpha1.GroupVersion
		}
		m, v := Configurations(p.ClientConfig, ca, api, p.PodPlacement)
		m.Name, v.Name = p.configurationName(), p.configurationName()
		if err := createOrUpdate(ctx, p.Client, m, &admissionregistrationv1.MutatingWebhookConfiguration{}, func(cur client.Object) {
			cur.(*admissionregistrationv1.MutatingWebhookConfiguration).Webhooks = m.Webhooks
		}); err != nil {
			return err
		}
		return createOrUpdate(ctx, p.Client, v, &admissionregistrationv1.ValidatingWebhookConfiguration{}, func(cur client.Object) {
			cur.(*admissionregistrationv1.ValidatingWebhookConfiguration).Webhooks = v.Webhooks
		})
	}
	var m admissionregistrationv1.MutatingWebhookConfiguration
	if err := p.Client.Get(ctx, types.NamespacedName{Name: p.configurationName()}, &m); err != nil {
		return err
	}
	changed := false
	for i := range m.Webhooks {
		if !bytes.Equal(m.Webhooks[i].ClientConfig.CABundle, ca) {
			m.Webhooks[i].ClientConfig.CABundle, changed = ca, true
		}
	}
	if changed {
		if err := p.Client.Update(ctx, &m); err != nil {
			return err
		}
	}
	var v admissionregistrationv1.ValidatingWebhookConfiguration
	if err := p.Client.Get(ctx, types.NamespacedName{Name: p.configurationName()}, &v); err != nil {
		return err
	}
	changed = false
	for i := range v.Webhooks {
		if !bytes.Equal(v.Webhooks[i].ClientConfig.CABundle, ca) {
			v.Webhooks[i].ClientConfig.CABundle, changed = ca, true
		}
	}
	if changed {
		return p.Client.Update(ctx, &v)
	}
	return nil
}

func createOrUpdate(ctx context.Context, c client.Client, want, cur client.Object, apply func(client.Object)) error {
	err := c.Get(ctx, client.ObjectKeyFromObject(want), cur)
	if apierrors.IsNotFound(err) {
		return c.Create(ctx, want)
	}
	if err != nil {
		return err
	}
	apply(cur)
	return c.Update(ctx, cur)
}
