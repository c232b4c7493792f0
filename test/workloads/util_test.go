package workloads_test

import (
	"bytes"
	"os/exec"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/cistern-csi/cistern/test/framework"
)

func resourceQ(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

// kubectlApply applies YAML with the framework's kubectl and returns its output and error, for
// tests that expect a refusal (framework.ApplyYAML fails the test instead).
func kubectlApply(t *testing.T, cp *framework.ControlPlane, yaml string) (string, error) {
	t.Helper()
	cmd := exec.Command(framework.Binary(t, "kubectl"), "--kubeconfig", cp.Kubeconfig, "apply", "-f", "-")
	cmd.Stdin = bytes.NewBufferString(yaml)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
