package testpeers

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/cistern-csi/cistern/test/testutil"
)

// Prometheus is a real Prometheus server (Debian's prometheus package) scraping the targets it
// was started with every second.
type Prometheus struct {
	URL string
	log *lockedBuffer
}

// Target is one scrape job's endpoint: host:port of /metrics, over HTTPS when HTTPS is set (the
// certificate is not checked: the endpoints under test are self-signed), with the bearer token
// in TokenFile when it is not empty.
type Target struct {
	Addr      string
	HTTPS     bool
	TokenFile string
}

// StartPrometheus starts Prometheus on the loopback with one scrape job per entry of jobs (job
// name -> its target), its data under dir; it is stopped at the test's end.
// Without the prometheus command the test is unavailable (testutil.Unavailable: it fails under
// CI=true).
func StartPrometheus(t testing.TB, dir string, jobs map[string]Target) *Prometheus {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		testutil.Unavailable(t, "needs the prometheus command (Debian package prometheus; make host-packages): %v", err)
	}
	names := make([]string, 0, len(jobs))
	for name := range jobs {
		names = append(names, name)
	}
	sort.Strings(names)
	var cfg strings.Builder
	cfg.WriteString("global: {scrape_interval: 1s, scrape_timeout: 1s}\nscrape_configs:\n")
	for _, name := range names {
		j := jobs[name]
		fmt.Fprintf(&cfg, "- job_name: %s\n  static_configs: [{targets: [%q]}]\n", name, j.Addr)
		if j.HTTPS {
			cfg.WriteString("  scheme: https\n  tls_config: {insecure_skip_verify: true}\n")
		}
		if j.TokenFile != "" {
			fmt.Fprintf(&cfg, "  authorization: {credentials_file: %q}\n", j.TokenFile)
		}
	}
	config := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(config, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := FreeAddr(t)
	log := &lockedBuffer{}
	cmd := exec.Command(bin, "--config.file="+config, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+addr)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting prometheus: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", log.String())
		}
	})
	return &Prometheus{URL: "http://" + addr, log: log}
}

// Sample is one series of an instant query's result.
type Sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// Query runs an instant PromQL query through the HTTP API. Before Prometheus listens, it returns
// an error; a refused query fails the test.
func (p *Prometheus) Query(t testing.TB, q string) ([]Sample, error) {
	t.Helper()
	resp, err := http.Get(p.URL + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []Sample `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("query %q: %d: %w", q, resp.StatusCode, err)
	}
	if body.Status != "success" {
		t.Fatalf("query %q: %s %s", q, body.Status, body.Error)
	}
	return body.Data.Result, nil
}

// Log is what Prometheus wrote so far.
func (p *Prometheus) Log() string { return p.log.String() }

// FreeAddr is a loopback address with a port free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
