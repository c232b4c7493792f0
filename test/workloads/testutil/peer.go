package testutil

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/cistern-csi/cistern/pkg/workloads/webhookcert"
	"github.com/cistern-csi/cistern/test/framework"
	ctestutil "github.com/cistern-csi/cistern/test/testutil"
)

// PeerTool returns the binary bin of a controller the suites run beside Cistern's (upstream
// LeaderWorkerSet, Kueue), which `make <target>` builds into framework.ToolDir(env, name), and the
// directory of that release's manifests. Without the binary the test is skipped, or fails under
// CI=true.
func PeerTool(t *testing.T, env, name, bin, target string) (path, config string) {
	t.Helper()
	binDir, err := framework.ToolDir(env, name)
	if err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(binDir, bin)
	if _, err := os.Stat(path); err != nil {
		ctestutil.Unavailable(t, "%v (run `make %s`)", err, target)
	}
	return path, filepath.Join(binDir, "..", "config")
}

// PeerWebhooks is the webhook server of such a controller, on a loopback port: its serving
// certificate, issued by a CA of the test's for 127.0.0.1, is in CertDir as tls.crt and tls.key.
type PeerWebhooks struct {
	Port    int
	CertDir string
	CACert  []byte
}

// NewPeerWebhooks takes a free port and writes a serving certificate for it.
func NewPeerWebhooks(t *testing.T) *PeerWebhooks {
	t.Helper()
	port, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	certs, err := webhookcert.Renew(webhookcert.Bundle{}, []string{"127.0.0.1"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	certDir := t.TempDir()
	for name, b := range map[string][]byte{"tls.crt": certs.Cert, "tls.key": certs.Key} {
		if err := os.WriteFile(filepath.Join(certDir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return &PeerWebhooks{Port: port, CertDir: certDir, CACert: certs.CACert}
}

// Install creates the webhook configurations of the controller's generated manifest at path, each
// named prefix+its name, with each webhook's Service replaced by this server's URL and the test's
// CA. scope, if not nil, gives the namespaceSelector of the webhook it is named; nil from it keeps
// the manifest's.
func (w *PeerWebhooks) Install(t *testing.T, c client.Client, path, prefix string, scope func(webhook string) *metav1.LabelSelector) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("https://127.0.0.1:%d", w.Port)
	for doc := range strings.SplitSeq(string(b), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		var obj client.Object
		switch meta.Kind {
		case "MutatingWebhookConfiguration":
			obj = &admissionregistrationv1.MutatingWebhookConfiguration{}
		case "ValidatingWebhookConfiguration":
			obj = &admissionregistrationv1.ValidatingWebhookConfiguration{}
		default:
			continue
		}
		if err := yaml.Unmarshal([]byte(doc), obj); err != nil {
			t.Fatal(err)
		}
		for _, h := range webhooksOf(obj) {
			*h.clientConfig = admissionregistrationv1.WebhookClientConfig{URL: ptr.To(base + *h.clientConfig.Service.Path), CABundle: w.CACert}
			if scope == nil {
				continue
			}
			if sel := scope(h.name); sel != nil {
				*h.namespaceSelector = sel
			}
		}
		obj.SetName(prefix + obj.GetName())
		if err := c.Create(context.Background(), obj); err != nil {
			t.Fatal(err)
		}
	}
}

// webhook is what Install rewrites in one webhook of a configuration, mutating or validating.
type webhook struct {
	name              string
	clientConfig      *admissionregistrationv1.WebhookClientConfig
	namespaceSelector **metav1.LabelSelector
}

func webhooksOf(obj client.Object) []webhook {
	var hooks []webhook
	switch o := obj.(type) {
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		for i := range o.Webhooks {
			w := &o.Webhooks[i]
			hooks = append(hooks, webhook{w.Name, &w.ClientConfig, &w.NamespaceSelector})
		}
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		for i := range o.Webhooks {
			w := &o.Webhooks[i]
			hooks = append(hooks, webhook{w.Name, &w.ClientConfig, &w.NamespaceSelector})
		}
	}
	return hooks
}

// PeerManager is how a test runs such a controller's manager: its CRDs and webhook configurations
// installed, its webhooks served on a loopback port with a certificate of the test's, and no
// metrics, probes, leader election or certificate management of its own.
type PeerManager struct {
	// Name names the process and its log.
	Name string
	// Config is the release's manifests directory (PeerTool): config/crd, webhooks.yaml.
	Config string
	// APIVersion is that of its Configuration file; Settings are more lines of it.
	APIVersion, Settings string
	// WebhookPrefix and WebhookScope are Install's prefix and scope.
	WebhookPrefix string
	WebhookScope  func(webhook string) *metav1.LabelSelector
	// Command is the manager's command line, given the Configuration file and the certificates'
	// directory.
	Command func(configFile, certDir string) *exec.Cmd
}

// StartPeerManager installs m's CRDs and webhook configurations on cp (with c), writes its
// Configuration, starts it, and returns once its webhook server answers.
func StartPeerManager(t *testing.T, cp *framework.ControlPlane, c client.Client, m PeerManager) *framework.Process {
	t.Helper()
	if err := InstallCRDs(cp.Config, filepath.Join(m.Config, "crd")); err != nil {
		t.Fatal(err)
	}
	hooks := NewPeerWebhooks(t)
	hooks.Install(t, c, filepath.Join(m.Config, "webhooks.yaml"), m.WebhookPrefix, m.WebhookScope)
	cfg := fmt.Sprintf(`apiVersion: %s
kind: Configuration
health: {healthProbeBindAddress: "0"}
metrics: {bindAddress: "0"}
webhook: {host: 127.0.0.1, port: %d, certDir: %s}
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
%s`, m.APIVersion, hooks.Port, hooks.CertDir, m.Settings)
	cfgPath := filepath.Join(t.TempDir(), m.Name+".yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	p := framework.StartCommand(t, m.Name, m.Command(cfgPath, hooks.CertDir))
	if err := p.WaitListening(fmt.Sprintf("127.0.0.1:%d", hooks.Port), 2*time.Minute); err != nil {
		t.Fatalf("%s webhook server: %v", m.Name, err)
	}
	return p
}
