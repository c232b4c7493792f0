package chart

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The namespace deploy/csi installs into, and the release's namespace the chart is rendered in.
const namespace = "cistern-system"

// Labels only Helm adds; every other label must match the kustomize base's.
var helmLabels = []string{"app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart"}

// objects are rendered objects by "Kind namespace/name".
type objects map[string]map[string]any

// TestChartMatchesKustomize: the chart with default values (and testImages) installs exactly
// what deploy/csi installs with an overlay setting the same images, and each switch of the chart what the kustomize component or overlay of the same
// name adds; the only object the chart leaves out is the Namespace (`helm install --namespace`).
// An object added to deploy/csi and not to the chart, or a flag changed in one and not the
// other, fails here.
func TestChartMatchesKustomize(t *testing.T) {
	for _, tc := range []struct {
		name       string
		values     string
		components []string // kustomize components of deploy/csi on top of the base
		overlays   []string // kustomizations of deploy/csi applied next to the base
	}{
		{name: "defaults"},
		{name: "snapshots", values: "snapshots: {enabled: true}", components: []string{"snapshots"}},
		{name: "leaderworkerset upstream API", values: "leaderWorkerSet: {upstreamAPI: true}", components: []string{"lws-upstream"}},
		{name: "both components", values: "snapshots: {enabled: true}\nleaderWorkerSet: {upstreamAPI: true}", components: []string{"lws-upstream", "snapshots"}},
		{name: "labelled pools profile", values: "pools: {labelledProfiles: [nvme]}", overlays: []string{"examples/pools-profile"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := renderKustomize(t, []string{"."}, tc.components...)
			for _, o := range tc.overlays {
				for k, v := range renderKustomize(t, []string{o}) {
					want[k] = v
				}
			}
			// The base's labels: reach neither its components' objects nor a separate
			// kustomization's; the chart labels every object it installs.
			for _, o := range want {
				setLabel(o, "app.kubernetes.io/part-of", "cistern")
			}
			got := renderChart(t, namespace, tc.values)
			if ns := "Namespace /" + namespace; want[ns] == nil {
				t.Errorf("kustomize rendered no %s", ns)
			} else {
				delete(want, ns)
			}
			compare(t, want, got)
		})
	}
}

// TestChartReleaseNamespace: rendered in another namespace, nothing of the chart names
// cistern-system (flags, subjects, webhook services, the placement webhook's exclusions).
func TestChartReleaseNamespace(t *testing.T) {
	got := renderChart(t, "storage", "snapshots: {enabled: true}\nleaderWorkerSet: {upstreamAPI: true}")
	for k, o := range got {
		b, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), namespace) {
			t.Errorf("%s names %s", k, namespace)
		}
		if md, _ := o["metadata"].(map[string]any); md["namespace"] != nil && md["namespace"] != "storage" && md["namespace"] != "default" {
			t.Errorf("%s is in namespace %v", k, md["namespace"])
		}
	}
	if got["DaemonSet storage/cistern-node"] == nil {
		t.Errorf("no DaemonSet storage/cistern-node in %v", keys(got))
	}
}

// TestChartValues: the values reach the objects (image registry and tag, flags, token requests).
func TestChartValues(t *testing.T) {
	got := renderChart(t, namespace, `
image: {registry: registry.example.com/storage/, tag: v1.2.3}
node: {limits: {maxDatasetBytes: 2199023255552}, extraArgs: [--v=5], s3: {caBundles: {secret: minio-ca}, allowPlainHTTP: true, unverifiableObjects: serve},
  webIdentity: {audience: sts.example.com, stsEndpoint: "https://sts.example.com", roles: "arn:aws:iam::1:role/team-*"}}
peer: {port: 7000, networkPolicy: {enabled: false}}
csiDriver: {tokenRequests: [{audience: vault, expirationSeconds: 600}]}
nodePVPolicy: {secretNamespaces: "default,datasets"}
`)
	ds := got["DaemonSet cistern-system/cistern-node"]
	b, _ := yaml.Marshal(ds)
	for _, want := range []string{
		"image: registry.example.com/storage/node:v1.2.3",
		"--max-dataset-bytes=2199023255552",
		"--peer-listen=:7000",
		"containerPort: 7000",
		"--v=5",
		"--s3-ca-bundles=/etc/cistern/s3-ca-bundles",
		"--s3-allow-plain-http",
		"--unverifiable-objects=serve",
		"secretName: minio-ca",
		"--web-identity-audience=sts.example.com",
		"--sts-endpoint=https://sts.example.com",
		"--web-identity-roles=arn:aws:iam::1:role/team-*",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("DaemonSet has no %q:\n%s", want, b)
		}
	}
	if got["NetworkPolicy cistern-system/cistern-node-peers"] != nil {
		t.Error("peer.networkPolicy.enabled=false rendered the NetworkPolicy")
	}
	for _, ns := range []string{"default", "datasets"} {
		// The grant the node PersistentVolume policy checks for Secrets outside a claim's namespace.
		if got["Role "+ns+"/cistern-node-secret-references"] == nil || got["RoleBinding "+ns+"/cistern-node-secret-references"] == nil {
			t.Errorf("nodePVPolicy.secretNamespaces rendered no Role and RoleBinding in %s", ns)
		}
	}
	b, _ = yaml.Marshal(got["CSIDriver /cistern.csi.dev"])
	if !strings.Contains(string(b), "audience: sts.example.com") || !strings.Contains(string(b), "audience: vault") {
		t.Errorf("CSIDriver has no token request:\n%s", b)
	}
	b, _ = yaml.Marshal(got["Deployment cistern-system/cistern-workload-controller"])
	if n := strings.Count(string(b), "registry.example.com/storage/workload-controller:v1.2.3"); n != 3 {
		t.Errorf("controller image appears %d times, want 3 (container, COMPARE_IMAGE, STAGER_IMAGE):\n%s", n, b)
	}
}

// TestChartStartupTaint: node.startupTaint.remove=false drops the flag; the DaemonSet tolerates
// the startup taint whatever node.tolerations says (the plugin must start where it is).
func TestChartStartupTaint(t *testing.T) {
	got := renderChart(t, namespace, `
image: {registry: registry.example.com/storage/, tag: v1.2.3}
node: {startupTaint: {remove: false}, tolerations: [{key: dedicated, operator: Exists}]}
`)
	b, _ := yaml.Marshal(got["DaemonSet cistern-system/cistern-node"])
	if strings.Contains(string(b), "--remove-startup-taint") {
		t.Errorf("node.startupTaint.remove=false still passes --remove-startup-taint:\n%s", b)
	}
	for _, want := range []string{"key: cistern.csi.dev/agent-not-ready", "key: dedicated"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("DaemonSet tolerations have no %q:\n%s", want, b)
		}
	}
}

func compare(t *testing.T, want, got objects) {
	t.Helper()
	for _, k := range keys(want) {
		if got[k] == nil {
			t.Errorf("the chart has no %s (deploy/csi has it: add it to the chart, or run `make generate-chart`)", k)
			continue
		}
		if d := cmp.Diff(want[k], got[k]); d != "" {
			t.Errorf("%s differs (-deploy/csi +chart):\n%s", k, d)
		}
	}
	for _, k := range keys(got) {
		if want[k] == nil {
			t.Errorf("the chart has %s, deploy/csi has not", k)
		}
	}
}

// renderKustomize renders the given kustomizations of deploy/csi (its base is ".") with its
// components, in an overlay that points the images at testImages' registry and tag, as the one
// `make push` writes does (with the replacements that copy the controller's image again).
func renderKustomize(t *testing.T, resources []string, components ...string) objects {
	t.Helper()
	out := filepath.Join(repoRoot(), "_output")
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(out, "chart-overlay-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	base, _ := filepath.Rel(dir, filepath.Join(repoRoot(), "deploy", "csi"))
	var res, comps []string
	for _, r := range resources {
		res = append(res, filepath.Join(base, r))
	}
	for _, c := range components {
		comps = append(comps, filepath.Join(base, c))
	}
	k := fmt.Sprintf("resources: [%s]\ncomponents: [%s]\nimages:\n", strings.Join(res, ", "), strings.Join(comps, ", "))
	for _, img := range []string{"node", "workload-controller"} {
		k += fmt.Sprintf("- {name: cistern/%s, newName: registry.example.com/cistern/%s, newTag: dev}\n", img, img)
	}
	// As `make push` writes it (hack/images/release ControllerImageReplacements): the
	// comparison and stager images follow the controller's, in the base.
	if slices.Contains(resources, ".") {
		k += `replacements:
- source:
    kind: Deployment
    name: cistern-workload-controller
    fieldPath: spec.template.spec.containers.[name=controller].image
  targets:
  - select: {kind: Deployment, name: cistern-workload-controller}
    fieldPaths:
    - spec.template.spec.containers.[name=controller].env.[name=COMPARE_IMAGE].value
    - spec.template.spec.containers.[name=controller].env.[name=STAGER_IMAGE].value
`
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return renderKustomizeDir(t, dir)
}

func renderKustomizeDir(t *testing.T, dir string) objects {
	t.Helper()
	resMap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize %s: %v", dir, err)
	}
	manifests, err := resMap.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return parse(t, "kustomize "+dir, string(manifests))
}

func renderChart(t *testing.T, ns, values string) objects {
	t.Helper()
	all := objects{}
	for name, content := range renderFiles(t, ns, values) {
		// `helm test`'s hooks, which kustomize has no counterpart of (TestChartHelmTest).
		if !strings.HasSuffix(name, ".yaml") || strings.HasPrefix(name, "cistern/templates/tests/") {
			continue
		}
		for _, doc := range releaseutil.SplitManifests(content) {
			for k, o := range parse(t, name, doc) {
				md := o["metadata"].(map[string]any)
				labels, _ := md["labels"].(map[string]any)
				for _, l := range helmLabels {
					delete(labels, l)
				}
				// What only Helm reads: the CRDs kept on uninstall (TestChartCRDsKept).
				if annotations, _ := md["annotations"].(map[string]any); annotations != nil {
					delete(annotations, "helm.sh/resource-policy")
					if len(annotations) == 0 {
						delete(md, "annotations")
					}
				}
				if all[k] != nil {
					t.Errorf("the chart renders %s twice", k)
				}
				all[k] = o
			}
		}
	}
	return all
}

// TestChartNotes: the notes after an install say what the defaults still refuse.
func TestChartNotes(t *testing.T) {
	for _, tc := range []struct {
		values string
		want   bool
	}{
		{values: "", want: true},
		{values: "node: {tenantS3Endpoints: s3.example.com}\nnodePVPolicy: {secretNamespaces: datasets}", want: false},
	} {
		notes := renderFiles(t, namespace, tc.values)["cistern/templates/NOTES.txt"]
		for _, s := range []string{"node.tenantS3Endpoints", "nodePVPolicy.secretNamespaces"} {
			if strings.Contains(notes, s) != tc.want {
				t.Errorf("values %q: notes mention %s: %v, want %v:\n%s", tc.values, s, !tc.want, tc.want, notes)
			}
		}
	}
}

// renderFiles renders every file of the chart, as helm install does, by name.
func renderFiles(t *testing.T, ns, values string) map[string]string {
	t.Helper()
	chrt, err := loader.Load(filepath.Join(repoRoot(), "charts", "cistern"))
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ReadValues([]byte(values))
	if err != nil {
		t.Fatal(err)
	}
	images, err := chartutil.ReadValues([]byte(testImages))
	if err != nil {
		t.Fatal(err)
	}
	vals = chartutil.CoalesceTables(vals, images)
	opts := chartutil.ReleaseOptions{Name: "cistern", Namespace: ns, Revision: 1, IsInstall: true}
	renderVals, err := chartutil.ToRenderValues(chrt, vals, opts, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(chrt, renderVals)
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// parse reads multi-document YAML into objects. The pools ConfigMap's values are YAML files the
// driver parses, compared as what they say rather than how they are written.
func parse(t *testing.T, source, manifests string) objects {
	t.Helper()
	objs := objects{}
	for _, doc := range releaseutil.SplitManifests(manifests) {
		var o map[string]any
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("%s: %v\n%s", source, err, doc)
		}
		if o == nil {
			continue
		}
		md, _ := o["metadata"].(map[string]any)
		// kustomize's namespace transformer also sets a namespace on cluster-scoped kinds its
		// schema does not know (admission policies); the API server has none for them.
		if clusterScoped[o["kind"].(string)] {
			delete(md, "namespace")
		}
		// A kustomize component's strategic merge puts its container first; the order of a
		// pod's containers changes nothing but kubectl's default container.
		if spec, ok := nested(o, "spec", "template", "spec").(map[string]any); ok {
			if cs, ok := spec["containers"].([]any); ok {
				sortByName(cs)
				for _, c := range cs {
					sortEnv(c.(map[string]any))
				}
			}
		}
		normalizeCEL(o)
		if o["kind"] == "ConfigMap" {
			data, _ := o["data"].(map[string]any)
			for k, v := range data {
				var parsed any
				if s, ok := v.(string); ok && strings.HasSuffix(k, ".yaml") && yaml.Unmarshal([]byte(s), &parsed) == nil {
					data[k] = parsed
				}
			}
		}
		ns, _ := md["namespace"].(string)
		objs[fmt.Sprintf("%s %s/%s", o["kind"], ns, md["name"])] = o
	}
	return objs
}

func sortByName(list []any) {
	sort.SliceStable(list, func(i, j int) bool {
		return list[i].(map[string]any)["name"].(string) < list[j].(map[string]any)["name"].(string)
	})
}

// sortEnv orders a container's variables by name, as a strategic merge patch may move the one it
// changes (the pools-profile overlay's POOLS_PROFILE); the order matters only to a variable that
// refers to another, which ours never do (checked).
func sortEnv(c map[string]any) {
	env, _ := c["env"].([]any)
	for _, e := range env {
		if v, _ := e.(map[string]any)["value"].(string); strings.Contains(v, "$(") {
			return
		}
	}
	sortByName(env)
}

// clusterScoped are the kinds of deploy/csi that have no namespace.
var clusterScoped = map[string]bool{
	"Namespace": true, "CustomResourceDefinition": true, "ClusterRole": true, "ClusterRoleBinding": true,
	"CSIDriver": true, "StorageClass": true, "PriorityClass": true,
	"MutatingWebhookConfiguration": true, "ValidatingWebhookConfiguration": true,
	"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true,
	"MutatingAdmissionPolicy": true, "MutatingAdmissionPolicyBinding": true,
}

// normalizeCEL collapses the whitespace of CEL expressions (admission policies, webhook match
// conditions): kustomize's YAML parser and Helm's fold a `>-` scalar's more-indented lines
// differently, and whitespace means nothing to CEL outside string literals, which ours keep on
// one line.
func normalizeCEL(v any) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if s, ok := e.(string); ok && (k == "expression" || k == "messageExpression") {
				v[k] = strings.Join(strings.Fields(s), " ")
			} else {
				normalizeCEL(e)
			}
		}
	case []any:
		for _, e := range v {
			normalizeCEL(e)
		}
	}
}

func nested(o map[string]any, path ...string) any {
	var cur any = o
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[p]
	}
	return cur
}

func setLabel(o map[string]any, key, value string) {
	md := o["metadata"].(map[string]any)
	labels, _ := md["labels"].(map[string]any)
	if labels == nil {
		labels = map[string]any{}
		md["labels"] = labels
	}
	labels[key] = value
}

func keys(o objects) []string {
	var ks []string
	for k := range o {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
