package workloads

import (
	"context"
	"fmt"
	"slices"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	workloadsv1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

// DropInLabel marks the LeaderWorkerSet CRD installed by the drop-in component
// (deploy/csi/lws-upstream). In drop-in mode the controller starts only on a CRD carrying it.
const DropInLabel = "workloads.cistern.dev/leaderworkerset-controller"

// ParseLeaderWorkerSetAPI reads the --leaderworkerset-api flag: the group/version LeaderWorkerSet is
// served under, workloads.cistern.dev/v1alpha1 (default) or leaderworkerset.x-k8s.io/v1.
func ParseLeaderWorkerSetAPI(s string) (schema.GroupVersion, error) {
	if s == "" {
		return workloadsv1alpha1.GroupVersion, nil
	}
	gv, err := schema.ParseGroupVersion(s)
	if err != nil {
		return schema.GroupVersion{}, err
	}
	if gv != workloadsv1alpha1.GroupVersion && gv != workloadsv1alpha1.UpstreamGroupVersion {
		return schema.GroupVersion{}, fmt.Errorf("LeaderWorkerSet API %s: must be %s or %s", s,
			workloadsv1alpha1.GroupVersion, workloadsv1alpha1.UpstreamGroupVersion)
	}
	return gv, nil
}

// checkSoleLeaderWorkerSetController refuses drop-in mode when another controller serves the
// group. Two signs, either enough:
//
//   - the group's LeaderWorkerSet CRD is not the drop-in component's (it lacks DropInLabel): it was
//     installed by upstream LWS's manifests, Helm chart or another project, whose controller runs
//     with it; a missing CRD is refused too, with the way to install it;
//   - an admission webhook of another configuration covers leaderworkersets of the group: every
//     LeaderWorkerSet controller serves defaulting and validation for its objects (upstream's
//     lws-mutating-webhook-configuration and lws-validating-webhook-configuration do).
//
// ours names our own webhook configurations, which are skipped.
func checkSoleLeaderWorkerSetController(ctx context.Context, c client.Reader, gv schema.GroupVersion, ours string) error {
	name := "leaderworkersets." + gv.Group
	var crd apiextensionsv1.CustomResourceDefinition
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("CustomResourceDefinition %s not found: install it with the kustomize component deploy/csi/lws-upstream", name)
		}
		return fmt.Errorf("CustomResourceDefinition %s: %w", name, err)
	}
	if crd.Labels[DropInLabel] != "cistern" {
		return fmt.Errorf("CustomResourceDefinition %s is not the drop-in component's (no label %s=cistern): "+
			"another LeaderWorkerSet controller owns %s; uninstall it first, or run without --leaderworkerset-api", name, DropInLabel, gv.Group)
	}
	if !slices.ContainsFunc(crd.Spec.Versions, func(v apiextensionsv1.CustomResourceDefinitionVersion) bool { return v.Name == gv.Version && v.Served }) {
		return fmt.Errorf("CustomResourceDefinition %s does not serve version %s", name, gv.Version)
	}

	var mutating admissionregistrationv1.MutatingWebhookConfigurationList
	if err := c.List(ctx, &mutating); err != nil {
		return fmt.Errorf("listing mutating webhook configurations: %w", err)
	}
	var validating admissionregistrationv1.ValidatingWebhookConfigurationList
	if err := c.List(ctx, &validating); err != nil {
		return fmt.Errorf("listing validating webhook configurations: %w", err)
	}
	type hook struct {
		config, name string
		rules        []admissionregistrationv1.RuleWithOperations
	}
	var hooks []hook
	for _, m := range mutating.Items {
		for _, w := range m.Webhooks {
			if m.Name != ours {
				hooks = append(hooks, hook{"MutatingWebhookConfiguration " + m.Name, w.Name, w.Rules})
			}
		}
	}
	for _, v := range validating.Items {
		for _, w := range v.Webhooks {
			if v.Name != ours {
				hooks = append(hooks, hook{"ValidatingWebhookConfiguration " + v.Name, w.Name, w.Rules})
			}
		}
	}
	for _, h := range hooks {
		for _, r := range h.rules {
			if coversLeaderWorkerSets(r.Rule, gv.Group) {
				return fmt.Errorf("%s (webhook %s) admits %s LeaderWorkerSets: another LeaderWorkerSet controller serves the group; "+
					"uninstall it first, or run without --leaderworkerset-api", h.config, h.name, gv.Group)
			}
		}
	}
	return nil
}

// coversLeaderWorkerSets says whether an admission rule applies to leaderworkersets of group.
func coversLeaderWorkerSets(r admissionregistrationv1.Rule, group string) bool {
	groupOK := slices.Contains(r.APIGroups, group) || slices.Contains(r.APIGroups, "*")
	resOK := slices.ContainsFunc(r.Resources, func(res string) bool {
		return res == "leaderworkersets" || res == "*" || res == "*/*" || res == "leaderworkersets/*"
	})
	return groupOK && resOK
}

// DropInCRD derives the drop-in LeaderWorkerSet CRD (leaderworkerset.x-k8s.io/v1) from the
// generated workloads.cistern.dev one: same schema, so every upstream v1 field is accepted along
// with Cistern's additions, another group and version, and DropInLabel. make generate-workloads
// writes it to deploy/csi/lws-upstream (TestDropInCRDManifest).
func DropInCRD(generated []byte) ([]byte, error) {
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(generated, &crd); err != nil {
		return nil, err
	}
	if crd.Spec.Group != workloadsv1alpha1.GroupVersion.Group || crd.Spec.Names.Kind != "LeaderWorkerSet" || len(crd.Spec.Versions) != 1 {
		return nil, fmt.Errorf("not the generated LeaderWorkerSet CRD: %s, kind %s, %d versions", crd.Spec.Group, crd.Spec.Names.Kind, len(crd.Spec.Versions))
	}
	gv := workloadsv1alpha1.UpstreamGroupVersion
	crd.Name = crd.Spec.Names.Plural + "." + gv.Group
	crd.Labels = map[string]string{DropInLabel: "cistern"}
	crd.Spec.Group = gv.Group
	crd.Spec.Versions[0].Name = gv.Version
	var raw map[string]any
	b, err := yaml.Marshal(&crd)
	if err != nil {
		return nil, err
	}
	if err := yaml.Unmarshal(b, &raw); err != nil {
		return nil, err
	}
	// Leave out what the API server fills in.
	delete(raw, "status")
	delete(raw["metadata"].(map[string]any), "creationTimestamp")
	return yaml.Marshal(raw)
}
