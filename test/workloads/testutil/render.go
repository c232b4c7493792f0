package testutil

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/cistern-csi/cistern/test/framework"
)

// Rendered is a rendered install: kind -> objects.
type Rendered map[string][]map[string]any

// Render runs `kubectl kustomize` on an overlay of deploy/csi with the given components of it
// (e.g. "snapshots"), as a user would write one. repoRoot is the repository; the overlay is made
// under its _output, since kustomize takes only relative paths to other directories.
func Render(kubectl, repoRoot string, components ...string) (Rendered, error) {
	out := filepath.Join(repoRoot, "_output")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(out, "overlay-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	base, _ := filepath.Rel(dir, filepath.Join(repoRoot, "deploy", "csi"))
	var comps []string
	for _, c := range components {
		comps = append(comps, filepath.Join(base, c))
	}
	kustomization := fmt.Sprintf("resources: [%s]\ncomponents: [%s]\n", base, strings.Join(comps, ", "))
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		return nil, err
	}
	manifests, err := exec.Command(kubectl, "kustomize", dir).Output()
	if err != nil {
		return nil, fmt.Errorf("kubectl kustomize: %w", err)
	}
	byKind := Rendered{}
	for _, doc := range bytes.Split(manifests, []byte("\n---\n")) {
		var o map[string]any
		if err := yaml.Unmarshal(doc, &o); err != nil {
			return nil, err
		}
		if kind, ok := o["kind"].(string); ok {
			byKind[kind] = append(byKind[kind], o)
		}
	}
	return byKind, nil
}

// YAML returns the objects of these kinds as one multi-document YAML.
func (r Rendered) YAML(kinds ...string) (string, error) {
	var docs []string
	for _, kind := range kinds {
		for _, o := range r[kind] {
			b, err := yaml.Marshal(o)
			if err != nil {
				return "", err
			}
			docs = append(docs, string(b))
		}
	}
	return strings.Join(docs, "\n---\n"), nil
}

// Named are the objects of r named name.
func (r Rendered) Named(name string) Rendered {
	out := Rendered{}
	for kind, objs := range r {
		for _, o := range objs {
			if meta, _ := o["metadata"].(map[string]any); meta["name"] == name {
				out[kind] = append(out[kind], o)
			}
		}
	}
	return out
}

// RBACKinds are the kinds the suites install from a rendered install to run the controller as its
// ServiceAccount: everything but the workloads and the Service-mode webhook configurations.
var RBACKinds = []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}

// RenderWithRBAC renders deploy/csi with components, if any (Render), and applies the result's
// RBACKinds and SelfRegisterRBAC to cp: what a suite needs to run the controller in this process
// as its ServiceAccount, besides the CRDs.
func RenderWithRBAC(t framework.TB, cp *framework.ControlPlane, components ...string) (Rendered, error) {
	t.Helper()
	rendered, err := Render(framework.Binary(t, "kubectl"), framework.RepoRoot(), components...)
	if err != nil {
		return nil, err
	}
	rbac, err := rendered.YAML(RBACKinds...)
	if err != nil {
		return nil, err
	}
	framework.ApplyYAML(t, cp, rbac)
	framework.ApplyYAML(t, cp, SelfRegisterRBAC)
	return rendered, nil
}
