package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/test/testutil"
)

// TestBinariesLogJSON runs the three binaries with --logging-format=json (component-base's
// json format, as kube components): each writes its start as a JSON line with ts, msg and v, and
// an unknown format is refused at start.
func TestBinariesLogJSON(t *testing.T) {
	dir := t.TempDir()
	if out, err := testutil.GoBuild(dir+"/", ".", "../storagepool-sidecar", "../workload-controller").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	pool := filepath.Join(dir, "pool")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	for name, content := range map[string]string{
		"pools.yaml": "pools:\n- name: fast\n  path: " + pool + "\n",
		// An API server nobody listens at: the binaries start, log, then fail to reach it.
		"kubeconfig": `{"apiVersion": "v1", "kind": "Config", "current-context": "c",
  "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
  "users": [{"name": "u", "user": {"token": "x"}}],
  "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(pool, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		bin, msg string
		args     []string
	}{
		{bin: "csi-driver", msg: "Starting Cistern CSI driver", args: []string{"--endpoint=unix://" + filepath.Join(dir, "csi.sock"),
			"--node-id=n1", "--pools-config=" + filepath.Join(dir, "pools.yaml"), "--state-dir=" + filepath.Join(dir, "state"),
			"--writeback-dir=", "--kubeconfig=" + kubeconfig}},
		{bin: "storagepool-sidecar", msg: "Starting storagepool-sidecar", args: []string{"--csi-address=" + filepath.Join(dir, "none.sock"),
			"--kubeconfig=" + kubeconfig, "--timeout=1s"}},
		{bin: "workload-controller", msg: "Starting workload-controller", args: []string{"--kubeconfig=" + kubeconfig,
			"--disable-webhooks", "--metrics-bind-address=0", "--health-probe-bind-address=0"}},
	} {
		t.Run(tc.bin, func(t *testing.T) {
			line := firstLine(t, filepath.Join(dir, tc.bin), append(tc.args, "--logging-format=json", "-v=2"), tc.msg)
			var rec map[string]any
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("not a JSON line: %q: %v", line, err)
			}
			if ts, ok := rec["ts"].(float64); !ok || ts <= 0 {
				t.Errorf("ts = %v, want a positive number: %s", rec["ts"], line)
			}
			if rec["msg"] != tc.msg {
				t.Errorf("msg = %v, want %q", rec["msg"], tc.msg)
			}
			if v, ok := rec["v"].(float64); !ok || v != 0 {
				t.Errorf("v = %v, want 0: %s", rec["v"], line)
			}
			out, err := exec.Command(filepath.Join(dir, tc.bin), "--logging-format=yaml").CombinedOutput()
			if err == nil || !strings.Contains(string(out), "Unsupported log format") {
				t.Errorf("--logging-format=yaml: %v, want refused:\n%s", err, out)
			}
		})
	}
}

// firstLine runs bin with args and returns the first line of its output containing msg; the
// process is killed then.
func firstLine(t *testing.T, bin string, args []string, msg string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var seen []string
	for sc := bufio.NewScanner(out); sc.Scan(); {
		if strings.Contains(sc.Text(), msg) {
			return sc.Text()
		}
		seen = append(seen, sc.Text())
	}
	t.Fatalf("%s never logged %q; its output:\n%s", filepath.Base(bin), msg, strings.Join(seen, "\n"))
	return ""
}
