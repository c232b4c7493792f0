package e2enode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/framework/realnode"
)

// HelmEnv is the helm command (hack/make/65-chart.mk builds it into the tools cache).
const HelmEnv = "CISTERN_HELM"

// The release the Helm install suite installs.
const helmRelease = "cistern"

// newHelmInstall is the helm command of TestInstall's second install, as the README's Install
// section shows it: the namespace created and labelled for privileged pods, `helm install` with
// the loopback registry's images and this node's pool, `helm upgrade` to the next image tag,
// `helm uninstall`; everything the kustomize install checks is checked the same way.
func newHelmInstall(t *testing.T) *helmInstall {
	bin := os.Getenv(HelmEnv)
	if _, err := os.Stat(bin); bin == "" || err != nil {
		realnode.Unavailable(t, "%s=%q: helm is not built; run `make e2e-install`", HelmEnv, bin)
	}
	return &helmInstall{bin: bin}
}

// helmInstall runs the helm command against the suite's control plane.
type helmInstall struct {
	bin string
	// values is the values file of the install; upgrades change only the image tag.
	values string
}

func (h *helmInstall) run(t *testing.T, in *install, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	home := filepath.Join(in.dir, "helm")
	cmd := exec.CommandContext(ctx, h.bin, append(args, "--kubeconfig="+in.cp.Kubeconfig, "--namespace="+installNamespace)...)
	// Helm's cache, configuration and data under the suite's directory, never the user's.
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// install creates the namespace as the README says and installs the chart with the registry's
// images, the node's pool, the examples' plain-HTTP S3 server allowed and the dataset example's
// Secret namespace listed for the node PersistentVolume policy.
func (h *helmInstall) install(t *testing.T, in *install) {
	t.Helper()
	root, err := realnode.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	nodeRepo, tag, _ := strings.Cut(in.nodeRef(), ":")
	ctrlRepo, ctrlTag, _ := strings.Cut(in.release["workload-controller"].Ref, ":")
	if ctrlTag != tag || filepath.Dir(nodeRepo) != filepath.Dir(ctrlRepo) {
		t.Fatalf("the chart takes one registry and tag for both images: %s, %s", in.nodeRef(), in.release["workload-controller"].Ref)
	}
	h.values = filepath.Join(in.dir, "values.yaml")
	values := fmt.Sprintf(`image:
  registry: %s/%s
  tag: %q
pools:
  profiles:
    default:
      pools:
      - name: fast
        path: %s
        labels: {media: ssd}
node:
  s3: {allowPlainHTTP: true}
nodePVPolicy: {secretNamespaces: default}
`, in.registry, filepath.Dir(nodeRepo), tag, installPoolDir)
	if err := os.WriteFile(h.values, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	framework.Kubectl(t, in.cp, "create", "namespace", installNamespace)
	framework.Kubectl(t, in.cp, "label", "namespace", installNamespace, "pod-security.kubernetes.io/enforce=privileged")
	out := h.run(t, in, "install", helmRelease, filepath.Join(root, "charts", "cistern"), "-f", h.values)
	t.Logf("helm install:\n%s", out)
}

// test runs `helm test`: its pod (csi-driver check-install) passes once the CSIDriver exists and
// the node that registered the driver has published its StoragePools, which the steps before
// waited for; helm fails the run when the pod fails.
func (h *helmInstall) test(t *testing.T, in *install) {
	t.Helper()
	// No --logs: the pod that passed is deleted at once (hook-succeeded), a failed one kept.
	out := h.run(t, in, "test", helmRelease, "--timeout=3m")
	if !strings.Contains(out, "cistern-check-install") || !strings.Contains(out, "Succeeded") {
		t.Errorf("helm test did not report its pod Succeeded:\n%s", out)
	}
	t.Logf("helm test:\n%s", out)
}

// upgrade moves both images to their tag with suffix; every other value stays.
func (h *helmInstall) upgrade(t *testing.T, in *install, suffix string) {
	t.Helper()
	root, err := realnode.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	_, tag, _ := strings.Cut(in.nodeRef(), ":")
	out := h.run(t, in, "upgrade", helmRelease, filepath.Join(root, "charts", "cistern"), "-f", h.values, "--set-string", "image.tag="+tag+suffix)
	t.Logf("helm upgrade:\n%s", out)
}

// uninstall removes the release, checks that it kept the CRDs (crds.keep), deletes them as
// docs/upgrading.md says, then the namespace the README had the user create.
func (h *helmInstall) uninstall(t *testing.T, in *install) {
	t.Helper()
	start := time.Now()
	out := h.run(t, in, "uninstall", helmRelease, "--wait", "--timeout=3m", "--ignore-not-found")
	t.Logf("helm uninstall (%s):\n%s", time.Since(start).Round(time.Second), out)
	var crds []string
	for _, f := range strings.Fields(kubectlOutput(in.cp, "get", "crd", "-l", "app.kubernetes.io/part-of=cistern", "-o", "name")) {
		if strings.HasPrefix(f, "customresourcedefinition") {
			crds = append(crds, f)
		}
	}
	// StoragePool, LeaderWorkerSet, NotebookValidationJob, VolumeManager.
	if len(crds) != 4 {
		t.Errorf("helm uninstall kept %d CRDs, want 4: %v", len(crds), crds)
	}
	kubectlOutput(in.cp, "delete", "crd", "-l", "app.kubernetes.io/part-of=cistern", "--wait=true", "--timeout=3m")
	kubectlOutput(in.cp, "delete", "namespace", installNamespace, "--wait=true", "--timeout=3m", "--ignore-not-found")
}
