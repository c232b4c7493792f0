package main

import (
	"bytes"
	"context"

	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cistern-csi/cistern/pkg/writeback/credstore"
	"github.com/cistern-csi/cistern/test/testutil"
)

// TestBinary runs the real binary: flags, /metrics and /healthz, no secret in logs at the
// highest verbosity, and a clean stop on SIGTERM.
func TestBinary(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "csi-driver")
	if out, err := testutil.GoBuild(bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	pool := filepath.Join(dir, "pool")
	if err := os.Mkdir(pool, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(cfg, []byte("pools:\n- name: fast\n  path: "+pool+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	sock := filepath.Join(dir, "csi.sock")
	var logs bytes.Buffer
	cmd := exec.Command(bin, "--endpoint", "unix://"+sock, "--node-id", "n1", "--pools-config", cfg,
		"--state-dir", filepath.Join(dir, "state"), "--writeback-dir", filepath.Join(dir, "writeback"), "--http-endpoint", addr, "-v", "5")
	// The kernel keeps the key of the write-back's sealed credentials beyond the run (credstore).
	t.Cleanup(func() { _ = credstore.Drop(filepath.Join(dir, "writeback", "secrets")) })
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })

	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("socket never appeared; logs:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctrl := csi.NewControllerClient(conn)
	const secret = "s3cr3t-value-never-logged"
	_, err = ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "v", CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}},
		Secrets: map[string]string{"secretAccessKey": secret}})
	if err != nil {
		t.Fatal(err)
	}

	body := get(t, "http://"+addr+"/metrics")
	for _, want := range []string{`cistern_pool_healthy{node="n1",pool="fast"} 1`, `cistern_pool_volumes{node="n1",pool="fast"} 1`,
		"csi_plugin_operations_seconds", "CreateVolume"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if got := get(t, "http://"+addr+"/healthz"); strings.TrimSpace(got) != "ok" {
		t.Errorf("/healthz = %q", got)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("driver exited with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("driver did not stop on SIGTERM")
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Error("socket left behind after stop")
	}
	out := logs.String()
	if strings.Contains(out, secret) {
		t.Error("a secret reached the logs")
	}
	if !strings.Contains(out, "***stripped***") {
		t.Errorf("payload logging at -v 5 did not show the stripped secret; logs:\n%s", out)
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}
