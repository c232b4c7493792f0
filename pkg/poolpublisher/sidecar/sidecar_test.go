package sidecar

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/standardflags"
)

const kubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`

func TestNew(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	ok := Config{
		Standard:     standardflags.SidecarConfiguration{CSIAddress: "/csi/csi.sock", KubeConfig: path, KubeAPIQPS: 5, KubeAPIBurst: 10},
		ResyncPeriod: time.Minute, ListPageSize: 500, MaxCachedDatasets: 64, Timeout: time.Second, UserAgent: "test/v1",
	}
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{name: "valid", mod: func(*Config) {}},
		{name: "failure case - no driver address", mod: func(c *Config) { c.Standard.CSIAddress = "" }, want: "--csi-address is required"},
		{name: "failure case - metrics twice", mod: func(c *Config) { c.Standard.MetricsAddress, c.Standard.HttpEndpoint = ":1", ":2" },
			want: "only one of --metrics-address and --http-endpoint"},
		{name: "failure case - no resync", mod: func(c *Config) { c.ResyncPeriod = 0 }, want: "--resync-period 0s must be positive"},
		{name: "failure case - negative page size, no timeout", mod: func(c *Config) { c.ListPageSize, c.Timeout = -1, 0 },
			want: "--list-page-size -1 must not be negative\n--timeout 0s must be positive"},
		{name: "failure case - cached datasets above the CRD's bound", mod: func(c *Config) { c.MaxCachedDatasets = 1025 },
			want: "--max-cached-datasets must be between 1 and 1024"},
		{name: "failure case - unreadable kubeconfig", mod: func(c *Config) { c.Standard.KubeConfig = path + ".missing" },
			want: "API server configuration"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.mod(&c)
			s, err := New(c)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if s.restConfig.QPS != 5 || s.restConfig.Burst != 10 || s.restConfig.UserAgent != "test/v1" {
					t.Errorf("rest config: QPS %v, burst %d, user agent %q", s.restConfig.QPS, s.restConfig.Burst, s.restConfig.UserAgent)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want %q", err, tc.want)
			}
		})
	}
}
