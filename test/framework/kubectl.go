package framework

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

const kubectlTimeout = 2 * time.Minute

// Kubectl runs the kubectl built by `make k8s-tools` (never one from PATH, whose version may not
// match) as admin against cp, fails the test if it fails, and returns its stdout.
func Kubectl(t TB, cp *ControlPlane, args ...string) string {
	t.Helper()
	return kubectl(t, cp, nil, args...)
}

func kubectl(t TB, cp *ControlPlane, stdin []byte, args ...string) string {
	t.Helper()
	cmd, cancel := kubectlCommand(cp, string(stdin), args...)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// KubectlOutput runs kubectl as Kubectl does, with stdin (none if empty), and returns its stdout
// and stderr and its error instead of failing the test: for tests that expect a refusal or look
// at what kubectl says.
func KubectlOutput(cp *ControlPlane, stdin string, args ...string) (string, error) {
	cmd, cancel := kubectlCommand(cp, stdin, args...)
	defer cancel()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// kubectlCommand is kubectl as admin against cp, bounded by kubectlTimeout (cancel releases it).
func kubectlCommand(cp *ControlPlane, stdin string, args ...string) (*exec.Cmd, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), kubectlTimeout)
	args = append([]string{"--kubeconfig=" + cp.Kubeconfig, "--cache-dir=" + filepath.Join(cp.Dir, "kubectl-cache")}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(cp.BinDir, "kubectl"), args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	return cmd, cancel
}

// ApplyManifests applies files or directories with server-side apply, as admin. A directory with
// a kustomization.yaml is applied as a kustomization (-k), any other directory recursively (-f).
// CustomResourceDefinitions it creates are Established when it returns. A CRD and objects of its
// kind must be applied in two calls.
func ApplyManifests(t TB, cp *ControlPlane, paths ...string) {
	t.Helper()
	for _, path := range paths {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatalf("manifests: %v", err)
		}
		source := []string{"--filename=" + path}
		if fi.IsDir() {
			source = []string{"--recursive", "--filename=" + path}
			if _, err := os.Stat(filepath.Join(path, "kustomization.yaml")); err == nil {
				source = []string{"--kustomize=" + path}
			}
		}
		apply(t, cp, nil, source...)
	}
}

// ApplyYAML applies manifests given inline (multi-document YAML), as ApplyManifests does.
func ApplyYAML(t TB, cp *ControlPlane, yaml string) {
	t.Helper()
	apply(t, cp, []byte(yaml), "--filename=-")
}

func apply(t TB, cp *ControlPlane, stdin []byte, source ...string) {
	t.Helper()
	args := append([]string{"apply", "--server-side", "--force-conflicts", "--field-manager=cistern-test"}, source...)
	out := kubectl(t, cp, stdin, args...)
	t.Logf("kubectl apply %s:\n%s", strings.Join(source, " "), strings.TrimSpace(out))
	if strings.Contains(out, "customresourcedefinition") {
		kubectl(t, cp, nil, "wait", "--for=condition=Established", "customresourcedefinitions", "--all", "--timeout=60s")
	}
}
