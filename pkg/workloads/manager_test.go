package workloads

import (
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

func TestConfigValidate(t *testing.T) {
	ok := Config{RestConfig: &rest.Config{}, WebhookPort: 9443, WebhookCertDir: "/tmp/c", WebhookServiceNamespace: "ns", WebhookSecretName: "s",
		WebhookServiceName: "svc", GitImage: "git", CompareImage: "controller"}
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{name: "service mode", mod: func(*Config) {}},
		{name: "self-register with a host", mod: func(c *Config) { c.WebhookSelfRegister, c.WebhookHost = true, "127.0.0.1" }},
		{name: "webhooks disabled needs nothing else", mod: func(c *Config) { *c = Config{RestConfig: c.RestConfig, DisableWebhooks: true} }},
		{name: "failure case - no API server", mod: func(c *Config) { c.RestConfig = nil }, want: "no API server configuration"},
		{name: "failure case - self-register without host", mod: func(c *Config) { c.WebhookSelfRegister = true },
			want: "--webhook-self-register needs --webhook-host"},
		{name: "mounted certificate needs no Secret", mod: func(c *Config) { c.DisableWebhookCertProvisioning, c.WebhookSecretName = true, "" }},
		{name: "failure case - self-register with a mounted certificate", mod: func(c *Config) {
			c.DisableWebhookCertProvisioning, c.WebhookSelfRegister, c.WebhookHost = true, true, "127.0.0.1"
		}, want: "--webhook-self-register needs --webhook-cert-provisioning"},
		{name: "failure case - no service", mod: func(c *Config) { c.WebhookServiceName = "" }, want: "webhook Service name is required"},
		{name: "failure case - bad port, no cert dir", mod: func(c *Config) { c.WebhookPort, c.WebhookCertDir = 0, "" },
			want: "webhook port 0 out of range\nwebhook certificate directory not set"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.mod(&c)
			err := c.validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want %q", err, tc.want)
			}
		})
	}
}
