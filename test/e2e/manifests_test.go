package e2e_test

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kindv1alpha4 "sigs.k8s.io/kind/pkg/apis/config/v1alpha4"
	"sigs.k8s.io/yaml"

	"github.com/cistern-csi/cistern/test/e2e/cluster"
	"github.com/cistern-csi/cistern/test/framework"
)

// deployDryRun: the API server accepts everything deploy/csi installs (schemas, RBAC references,
// CRDs) without installing it, with server-side apply as the docs say. (Client-side apply cannot
// install it: the LeaderWorkerSet CRD, 473 kB with its own fields described for kubectl explain, is over
// the 256 KiB its last-applied annotation may hold, as upstream LeaderWorkerSet's CRD is.)
func deployDryRun(t *testing.T, cp *framework.ControlPlane) {
	t.Helper()
	out := framework.Kubectl(t, cp, "apply", "--server-side", "--dry-run=server", "--field-manager=cistern-e2e", "-k", cluster.DeployDir())
	t.Logf("kubectl apply --server-side --dry-run=server -k deploy/csi:\n%s", out)
	for _, want := range []string{
		"csidriver.storage.k8s.io/cistern.csi.dev",
		"daemonset.apps/cistern-node",
		"clusterrole.rbac.authorization.k8s.io/cistern-csi-provisioner",
		"configmap/cistern-pools",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run did not list %s", want)
		}
	}
}

// TestKustomizationsBuild: every kustomization under deploy/ (the base, its parts, the examples
// and their overlays, each component on top of the base) renders and is accepted by the API
// server (a server-side dry run of what it renders, with Cistern's CRDs installed), and the base
// includes every component directory under deploy/csi, so `apply -k deploy/csi` installs all.
// Every node plugin pod a DaemonSet renders is one the peer port's NetworkPolicy covers.
var imageLine = regexp.MustCompile(`(?m)^\s*(?:- )?image: *"?([^"\s]+)`)

func TestKustomizationsBuild(t *testing.T) {
	cp := framework.Shared(t)
	cluster.CreateNamespace(t, cp)
	framework.ApplyManifests(t, cp, filepath.Join(cluster.DeployDir(), "crds"))
	// Webhooks an earlier suite left registered by URL would refuse the examples' dry runs.
	cluster.ForgetWebhooks(t, cp)
	// The examples' pods need the ServiceAccount kube-controller-manager makes.
	eventually(t, time.Minute, "ServiceAccount default/default", func(ctx context.Context) error {
		_, err := cp.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	deploy := filepath.Dir(cluster.DeployDir())
	var dirs []string
	err := filepath.WalkDir(deploy, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == "kustomization.yaml" {
			dirs = append(dirs, filepath.Dir(path))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 8 {
		t.Fatalf("only %d kustomizations under deploy/: %v", len(dirs), dirs)
	}
	base := framework.Kubectl(t, cp, "kustomize", cluster.DeployDir())
	peerPolicy := peerNetworkPolicy(t, base)
	installed := objectKeys(t, base)
	noDenyWithoutParameter(t, base)
	for _, dir := range dirs {
		rel, _ := filepath.Rel(deploy, dir)
		t.Run(rel, func(t *testing.T) {
			target := dir
			if isComponent(t, dir) {
				target = overlayWith(t, strings.TrimPrefix(rel, "csi/"))
			}
			out := framework.Kubectl(t, cp, "kustomize", target)
			if !strings.Contains(out, "kind:") {
				t.Fatalf("kubectl kustomize deploy/%s: no objects", rel)
			}
			// `kubectl delete -k` of an example or of the quick start deletes what it renders:
			// never an object of the install (the node PersistentVolume policy's ConfigMap was one).
			if strings.HasPrefix(rel, "csi/examples") || rel == "quickstart" {
				for k := range objectKeys(t, out) {
					if installed[k] {
						t.Errorf("deploy/%s renders %s, which deploy/csi installs: deleting the example would delete it", rel, k)
					}
				}
			}
			// Every image has a tag, never latest: an upgrade is a new tag, and a kustomize
			// images: entry is how a user picks registry and version.
			for _, m := range imageLine.FindAllStringSubmatch(out, -1) {
				ref := m[1]
				tag := ref[strings.LastIndex(ref, "/")+1:]
				if !strings.Contains(tag, ":") || strings.HasSuffix(tag, ":latest") {
					t.Errorf("deploy/%s: image %s has no version tag", rel, ref)
				}
			}
			// A dry run creates no Namespace: one the kustomization brings (the quick start's)
			// is created first, so that its objects are checked in it.
			createNamespaces(t, cp, out)
			rendered := filepath.Join(t.TempDir(), "rendered.yaml")
			if err := os.WriteFile(rendered, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
			if b, err := framework.KubectlOutput(cp, "", "apply", "--server-side",
				"--dry-run=server", "--force-conflicts", "--field-manager=cistern-deploy-check", "-f", rendered); err != nil {
				t.Errorf("kubectl apply --server-side --dry-run=server of deploy/%s: %v\n%s", rel, err, b)
			}
			for _, ds := range daemonSets(t, out) {
				if !peerPolicy.Matches(labels.Set(ds.Spec.Template.Labels)) {
					t.Errorf("deploy/%s: DaemonSet %s's pods (labels %v) are outside the NetworkPolicy cistern-node-peers (%v)",
						rel, ds.Name, ds.Spec.Template.Labels, peerPolicy)
				}
			}
		})
	}
	data, err := os.ReadFile(filepath.Join(cluster.DeployDir(), "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(cluster.DeployDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		included := slices.ContainsFunc(k.Resources, func(r string) bool {
			return r == e.Name() || strings.HasPrefix(r, e.Name()+"/")
		})
		if !e.IsDir() || e.Name() == "examples" || included || isComponent(t, filepath.Join(cluster.DeployDir(), e.Name())) {
			continue
		}
		t.Errorf("deploy/csi/kustomization.yaml does not include %s/", e.Name())
	}
}

// peerNetworkPolicy returns the pod selector of the NetworkPolicy cistern-node-peers in rendered
// manifests.
func peerNetworkPolicy(t *testing.T, manifests string) labels.Selector {
	t.Helper()
	for _, doc := range strings.Split(manifests, "\n---\n") {
		var np networkingv1.NetworkPolicy
		if err := yaml.Unmarshal([]byte(doc), &np); err != nil {
			t.Fatal(err)
		}
		if np.Kind == "NetworkPolicy" && np.Name == "cistern-node-peers" {
			sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
			if err != nil {
				t.Fatal(err)
			}
			return sel
		}
	}
	t.Fatal("deploy/csi renders no NetworkPolicy cistern-node-peers")
	return nil
}

// noDenyWithoutParameter: no admission policy binding of the install refuses requests when its
// parameter object is missing. The API server resolves a binding's parameter before it evaluates
// the policy's match conditions, so such a binding refuses every request its policy matches, of
// every user, once the parameter is deleted: the node PersistentVolume policy did, and deleting
// the examples that carried its ConfigMap left no PersistentVolume releasable.
func noDenyWithoutParameter(t *testing.T, manifests string) {
	t.Helper()
	for _, doc := range strings.Split(manifests, "\n---\n") {
		var b admissionregistrationv1.ValidatingAdmissionPolicyBinding
		if err := yaml.Unmarshal([]byte(doc), &b); err != nil {
			t.Fatal(err)
		}
		if b.Kind != "ValidatingAdmissionPolicyBinding" || b.Spec.ParamRef == nil {
			continue
		}
		if a := b.Spec.ParamRef.ParameterNotFoundAction; a == nil || *a != admissionregistrationv1.AllowAction {
			t.Errorf("ValidatingAdmissionPolicyBinding %s refuses every request its policy matches when its parameter is missing (parameterNotFoundAction %v)", b.Name, a)
		}
	}
}

// objectKeys names the objects of rendered manifests: group/kind namespace/name.
func objectKeys(t *testing.T, manifests string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, doc := range strings.Split(manifests, "\n---\n") {
		var obj metav1.PartialObjectMetadata
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		if obj.Kind == "" {
			continue
		}
		gv, _ := schema.ParseGroupVersion(obj.APIVersion)
		out[gv.Group+"/"+obj.Kind+" "+obj.Namespace+"/"+obj.Name] = true
	}
	return out
}

// createNamespaces creates the Namespaces of rendered manifests that do not exist yet, and
// deletes them when the test ends.
func createNamespaces(t *testing.T, cp *framework.ControlPlane, manifests string) {
	t.Helper()
	for _, doc := range strings.Split(manifests, "\n---\n") {
		var ns corev1.Namespace
		if err := yaml.Unmarshal([]byte(doc), &ns); err != nil {
			t.Fatal(err)
		}
		if ns.Kind != "Namespace" {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := cp.Client.CoreV1().Namespaces().Create(ctx, &ns, metav1.CreateOptions{})
		cancel()
		if apierrors.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			t.Fatalf("creating namespace %s: %v", ns.Name, err)
		}
		t.Cleanup(func() {
			_ = cp.Client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
		})
	}
}

// daemonSets returns the DaemonSets in rendered manifests whose pods serve the peer port.
func daemonSets(t *testing.T, manifests string) []appsv1.DaemonSet {
	t.Helper()
	var out []appsv1.DaemonSet
	for _, doc := range strings.Split(manifests, "\n---\n") {
		var ds appsv1.DaemonSet
		if err := yaml.Unmarshal([]byte(doc), &ds); err != nil {
			t.Fatal(err)
		}
		if ds.Kind != "DaemonSet" {
			continue
		}
		for _, c := range ds.Spec.Template.Spec.Containers {
			if slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.ContainerPort == 7443 }) {
				out = append(out, ds)
				break
			}
		}
	}
	return out
}

func isComponent(t *testing.T, dir string) bool {
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return false
	}
	var k struct {
		Kind string `json:"kind"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	return k.Kind == "Component"
}

// overlayWith writes an overlay of the base with a component, inside the repository (kustomize
// takes only relative paths to other directories), and returns its directory.
func overlayWith(t *testing.T, component string) string {
	out := filepath.Join(cluster.DeployDir(), "..", "..", "_output")
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(out, "overlay-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	base, err := filepath.Rel(dir, cluster.DeployDir())
	if err != nil {
		t.Fatal(err)
	}
	k := "resources: [" + base + "]\ncomponents: [" + filepath.Join(base, component) + "]\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestDeployedFlagsExist: every flag the install manifests pass to a binary this project builds
// (the driver, the sidecar, the controller, and the upstream csi-provisioner of `make csi-tools`)
// is one that binary defines, so a renamed or dropped flag fails here rather than in a
// crash-looping pod. The registrar's and livenessprobe's flags are left to their images.
func TestDeployedFlagsExist(t *testing.T) {
	b := binaries(t)
	cp := framework.Shared(t)
	byImage := map[string]map[string][]string{ // image repository -> command -> binary and its subcommand
		"cistern/node": {"/usr/local/bin/csi-driver": {b.Driver}, "/usr/local/bin/csi-driver fuse-keeper": {b.Driver, "fuse-keeper"},
			"/usr/local/bin/storagepool-sidecar": {b.Sidecar}},
		"cistern/workload-controller":                 {"": {b.Controller}},
		"registry.k8s.io/sig-storage/csi-provisioner": {"": {b.Provisioner}},
	}
	manifests := framework.Kubectl(t, cp, "kustomize", cluster.DeployDir())
	checked := 0
	for _, doc := range strings.Split(manifests, "\n---\n") {
		var obj struct {
			Kind string `json:"kind"`
			Spec struct {
				Template struct {
					Spec corev1.PodSpec `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		if obj.Kind != "DaemonSet" && obj.Kind != "Deployment" {
			continue
		}
		for _, c := range obj.Spec.Template.Spec.Containers {
			repo, _, _ := strings.Cut(c.Image, ":")
			commands, ok := byImage[repo]
			if !ok {
				continue
			}
			command := strings.Join(c.Command, " ")
			bin, ok := commands[command]
			if !ok {
				t.Errorf("%s container %s: command %q is not one the image has", obj.Kind, c.Name, command)
				continue
			}
			defined := flagsOf(t, bin[0], bin[1:]...)
			for _, arg := range c.Args {
				name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
				if !strings.HasPrefix(arg, "-") || !defined[name] {
					t.Errorf("%s container %s: %s does not define the flag in %q", obj.Kind, c.Name, strings.Join(append([]string{filepath.Base(bin[0])}, bin[1:]...), " "), arg)
				}
				checked++
			}
		}
	}
	if checked == 0 {
		t.Fatal("no container arguments checked: the manifests or the image names changed")
	}
	t.Logf("%d flags checked", checked)
}

// flagsOf lists the flags a Go program prints for -help (flag and pflag both name each one at
// the start of a line, after spaces, with one or two dashes).
func flagsOf(t *testing.T, bin string, subcommand ...string) map[string]bool {
	t.Helper()
	out, _ := exec.Command(bin, append(subcommand, "-help")...).CombinedOutput() // exits 0 or 2 by flag package
	flags := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], "-") {
			continue
		}
		flags[strings.TrimLeft(strings.TrimSuffix(f[0], ","), "-")] = true
		if strings.HasSuffix(f[0], ",") && len(f) > 1 { // pflag: "-v, --v Level"
			flags[strings.TrimLeft(f[1], "-")] = true
		}
	}
	if len(flags) == 0 {
		t.Fatalf("%s -help listed no flags:\n%s", bin, out)
	}
	return flags
}

// TestKindConfig: deploy/kind/kind-config.yaml decodes strictly into kind's own v1alpha4 types,
// so a misspelt field fails here, on a machine without Docker, not at `make kind-up`.
func TestKindConfig(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(framework.RepoRoot(), "deploy", "kind", "kind-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c kindv1alpha4.Cluster
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		t.Fatalf("kind-config.yaml: %v", err)
	}
	if c.Kind != "Cluster" || c.APIVersion != "kind.x-k8s.io/v1alpha4" {
		t.Errorf("kind-config.yaml is %s %s, want kind.x-k8s.io/v1alpha4 Cluster", c.APIVersion, c.Kind)
	}
	workers := 0
	for _, n := range c.Nodes {
		if n.Role != kindv1alpha4.WorkerRole {
			continue
		}
		workers++
		// The default pools profile (deploy/csi/driver/pools.yaml) has a pool at /mnt/cistern/fast.
		if !slices.ContainsFunc(n.ExtraMounts, func(m kindv1alpha4.Mount) bool { return m.ContainerPath == "/mnt/cistern/fast" }) {
			t.Errorf("a worker has no extra mount for the fast pool at /mnt/cistern/fast")
		}
	}
	if workers == 0 {
		t.Error("kind-config.yaml has no worker nodes")
	}
}

// TestVersion: each command prints the version it was built with (the Makefile's $VERSION, from
// git describe; "dev" outside make) for --version, and exits 0.
func TestVersion(t *testing.T) {
	b := binaries(t)
	want := os.Getenv("VERSION")
	if want == "" {
		want = "dev"
	}
	for _, bin := range []string{b.Driver, b.Sidecar, b.Controller} {
		out, err := exec.Command(bin, "--version").CombinedOutput()
		if err != nil {
			t.Errorf("%s --version: %v\n%s", filepath.Base(bin), err, out)
			continue
		}
		if got := strings.TrimSpace(string(out)); got != want {
			t.Errorf("%s --version printed %q, want %q", filepath.Base(bin), got, want)
		}
	}
}
