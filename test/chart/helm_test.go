package chart

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// HelmEnv is the helm command `make test-chart` builds and exports (hack/make/65-chart.mk).
const HelmEnv = "CISTERN_HELM"

// kubeVersion is the Kubernetes version `helm template` renders for: a helm built from source
// without upstream's ldflags (`make helm`) assumes v1.20, which the chart's kubeVersion refuses.
// The suites' control plane runs this version (hack/make/20-harness.mk).
const kubeVersion = "v1.37.2"

// testImages are the values every render of the chart needs: image.registry is required.
const testImages = "image: {registry: registry.example.com/cistern, tag: dev}\n"

// helm runs the helm command with its cache and configuration in a temporary directory.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin := os.Getenv(HelmEnv)
	if _, err := os.Stat(bin); bin == "" || err != nil {
		t.Fatalf("%s=%q: no helm command; run `make test-chart`, which builds it", HelmEnv, bin)
	}
	home := t.TempDir()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// valuesFile writes values into a file for helm's -f.
func valuesFile(t *testing.T, values string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// helmTemplate renders the chart with `helm template` as `helm install` would, in namespace
// cistern-system, with testImages under the given values files' contents.
func helmTemplate(t *testing.T, values ...string) (string, error) {
	t.Helper()
	args := []string{"template", "cistern", chartDir(), "--namespace", namespace, "--kube-version", kubeVersion,
		"-f", valuesFile(t, testImages)}
	for _, v := range values {
		args = append(args, "-f", valuesFile(t, v))
	}
	return helm(t, args...)
}

// helmObjects renders the chart with helmTemplate and parses its objects; a failed render fails
// the test.
func helmObjects(t *testing.T, values ...string) objects {
	t.Helper()
	out, err := helmTemplate(t, values...)
	if err != nil {
		t.Fatalf("helm template with %q: %v\n%s", values, err, out)
	}
	return parse(t, "helm template", out)
}

// helmLint runs `helm lint --strict` with the given values files' contents.
func helmLint(t *testing.T, values ...string) (string, error) {
	t.Helper()
	args := []string{"lint", "--strict", chartDir(), "--kube-version", kubeVersion}
	for _, v := range values {
		args = append(args, "-f", valuesFile(t, v))
	}
	return helm(t, args...)
}

func chartDir() string { return filepath.Join(repoRoot(), "charts", "cistern") }

// pods are the pod templates of the rendered workloads, by "Kind namespace/name".
func pods(objs objects) map[string]map[string]any {
	ps := map[string]map[string]any{}
	for k, o := range objs {
		if !strings.HasPrefix(k, "DaemonSet ") && !strings.HasPrefix(k, "Deployment ") {
			continue
		}
		if spec, ok := nested(o, "spec", "template", "spec").(map[string]any); ok {
			ps[k] = spec
		}
	}
	return ps
}

// containers are a pod spec's containers and init containers.
func containers(spec map[string]any) []map[string]any {
	var cs []map[string]any
	for _, field := range []string{"initContainers", "containers"} {
		list, _ := spec[field].([]any)
		for _, c := range list {
			cs = append(cs, c.(map[string]any))
		}
	}
	return cs
}
