package chart

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestChartHelmTest: `helm test` runs one pod, a hook deleted before the next test and once it
// passed, running the node image's `csi-driver check-install` within the restricted Pod Security
// Standard, as a ServiceAccount (a hook too) whose ClusterRole only gets the CSIDriver and lists
// CSINodes and StoragePools.
func TestChartHelmTest(t *testing.T) {
	const ns = "storage"
	objs := objects{}
	for name, content := range renderFiles(t, ns, "imagePullSecrets: [{name: regcred}]") {
		if strings.HasPrefix(name, "cistern/templates/tests/") {
			for k, o := range parse(t, name, content) {
				objs[k] = o
			}
		}
	}
	want := []string{"ClusterRole /cistern-check-install", "ClusterRoleBinding /cistern-check-install",
		"Pod storage/cistern-check-install", "ServiceAccount storage/cistern-check-install"}
	if d := cmp.Diff(want, keys(objs)); d != "" {
		t.Fatalf("helm test's objects (-want +got):\n%s", d)
	}
	for k, o := range objs {
		if h := nested(o, "metadata", "annotations", "helm.sh/hook"); h != "test" {
			t.Errorf("%s: helm.sh/hook %v, want test", k, h)
		}
		policy, _ := nested(o, "metadata", "annotations", "helm.sh/hook-delete-policy").(string)
		if !slices.Contains(strings.Split(policy, ","), "before-hook-creation") {
			t.Errorf("%s: hook-delete-policy %q, want before-hook-creation", k, policy)
		}
		if nested(o, "metadata", "labels", "app.kubernetes.io/part-of") != "cistern" {
			t.Errorf("%s: labels %v", k, nested(o, "metadata", "labels"))
		}
	}

	pod := objs["Pod storage/cistern-check-install"]
	spec := pod["spec"].(map[string]any)
	if spec["serviceAccountName"] != "cistern-check-install" || spec["restartPolicy"] != "Never" {
		t.Errorf("the pod runs as %v, restartPolicy %v", spec["serviceAccountName"], spec["restartPolicy"])
	}
	if got := nested(spec, "securityContext", "seccompProfile", "type"); got != "RuntimeDefault" {
		t.Errorf("seccompProfile %v, want RuntimeDefault", got)
	}
	for _, v := range restrictedViolations(spec) {
		t.Errorf("not restricted: %s", v)
	}
	if d := cmp.Diff([]any{map[string]any{"name": "regcred"}}, spec["imagePullSecrets"]); d != "" {
		t.Errorf("imagePullSecrets (-want +got):\n%s", d)
	}
	c := containers(spec)
	if len(c) != 1 || c[0]["image"] != "registry.example.com/cistern/node:dev" || nested(c[0], "args") == nil || c[0]["args"].([]any)[0] != "check-install" {
		t.Fatalf("the pod's containers %v, want one running the node image's check-install", c)
	}

	// Read-only, and only what the check reads.
	rules := objs["ClusterRole /cistern-check-install"]["rules"].([]any)
	var resources []string
	for _, r := range rules {
		r := r.(map[string]any)
		for _, v := range r["verbs"].([]any) {
			if v != "get" && v != "list" {
				t.Errorf("rule %v grants %v", r, v)
			}
		}
		for _, res := range r["resources"].([]any) {
			resources = append(resources, res.(string))
		}
		if slices.Contains(r["resources"].([]any), any("csidrivers")) && !slices.Equal(r["resourceNames"].([]any), []any{"cistern.csi.dev"}) {
			t.Errorf("the CSIDriver rule is not limited to cistern.csi.dev: %v", r)
		}
	}
	slices.Sort(resources)
	if d := cmp.Diff([]string{"csidrivers", "csinodes", "storagepools"}, resources); d != "" {
		t.Errorf("the check's role covers (-want +got):\n%s", d)
	}
	binding := objs["ClusterRoleBinding /cistern-check-install"]
	if d := cmp.Diff([]any{map[string]any{"kind": "ServiceAccount", "name": "cistern-check-install", "namespace": ns}}, binding["subjects"]); d != "" ||
		nested(binding, "roleRef", "name") != "cistern-check-install" {
		t.Errorf("the binding %v does not bind the pod's ServiceAccount to its role: %s", binding, d)
	}
}
