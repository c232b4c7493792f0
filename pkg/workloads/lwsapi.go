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

// PeerWebhookLabel, set to "true" on a mutating or validating webhook configuration by the
// administrator, declares its LeaderWorkerSet webhooks to be a peer's admission checks (a policy
// or queueing system that runs no LeaderWorkerSet controller), so the drop-in starts beside them.
const PeerWebhookLabel = "workloads.cistern.dev/leaderworkerset-peer"

// kueueGroup is Kueue's own API group. Kueue's LeaderWorkerSet integration registers
// mleaderworkerset.kb.io and vleaderworkerset.kb.io (the names upstream LWS's controller uses too)
// in the same two configurations as the webhooks of its own objects (ClusterQueues, Workloads), in
// its kustomize manifests and Helm chart alike; an LWS controller has no reason to admit them.
const kueueGroup = "kueue.x-k8s.io"

// checkSoleLeaderWorkerSetController refuses drop-in mode when another controller serves the
// group. Two signs, either enough:
//
//   - the group's LeaderWorkerSet CRD is not the drop-in component's (it lacks DropInLabel): it was
//     installed by upstream LWS's manifests, Helm chart or another project, whose controller runs
//     with it; a missing CRD is refused too, with the way to install it;
//   - an admission webhook of another configuration names leaderworkersets of the group: every
//     LeaderWorkerSet controller serves defaulting and validation for its objects (upstream's
//     lws-mutating-webhook-configuration and lws-validating-webhook-configuration do).
//
// Webhooks that admit LeaderWorkerSets without serving them are not rivals: those of ours (the
// configurations named ours), of Kueue (peerOf), of a configuration labelled PeerWebhookLabel, and
// wildcard rules (policy engines such as Gatekeeper and Kyverno match every resource). It returns
// the peers it found, for the log.
func checkSoleLeaderWorkerSetController(ctx context.Context, c client.Reader, gv schema.GroupVersion, ours string) ([]string, error) {
	name := "leaderworkersets." + gv.Group
	var crd apiextensionsv1.CustomResourceDefinition
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("CustomResourceDefinition %s not found: install it with the kustomize component deploy/csi/lws-upstream", name)
		}
		return nil, fmt.Errorf("CustomResourceDefinition %s: %w", name, err)
	}
	if crd.Labels[DropInLabel] != "cistern" {
		return nil, fmt.Errorf("CustomResourceDefinition %s is not the drop-in component's (no label %s=cistern): "+
			"another LeaderWorkerSet controller owns %s; uninstall it first, or run without --leaderworkerset-api", name, DropInLabel, gv.Group)
	}
	if !slices.ContainsFunc(crd.Spec.Versions, func(v apiextensionsv1.CustomResourceDefinitionVersion) bool { return v.Name == gv.Version && v.Served }) {
		return nil, fmt.Errorf("CustomResourceDefinition %s does not serve version %s", name, gv.Version)
	}

	var mutating admissionregistrationv1.MutatingWebhookConfigurationList
	if err := c.List(ctx, &mutating); err != nil {
		return nil, fmt.Errorf("listing mutating webhook configurations: %w", err)
	}
	var validating admissionregistrationv1.ValidatingWebhookConfigurationList
	if err := c.List(ctx, &validating); err != nil {
		return nil, fmt.Errorf("listing validating webhook configurations: %w", err)
	}
	var configs []webhookConfig
	for _, m := range mutating.Items {
		wc := webhookConfig{kind: "MutatingWebhookConfiguration", name: m.Name, labels: m.Labels}
		for _, w := range m.Webhooks {
			wc.hooks = append(wc.hooks, namedRules{w.Name, w.Rules})
		}
		configs = append(configs, wc)
	}
	for _, v := range validating.Items {
		wc := webhookConfig{kind: "ValidatingWebhookConfiguration", name: v.Name, labels: v.Labels}
		for _, w := range v.Webhooks {
			wc.hooks = append(wc.hooks, namedRules{w.Name, w.Rules})
		}
		configs = append(configs, wc)
	}
	var peers []string
	for _, wc := range configs {
		if wc.name == ours {
			continue
		}
		hook := wc.leaderWorkerSetHook(gv.Group)
		if hook == "" {
			continue
		}
		if peer := wc.peerOf(); peer != "" {
			peers = append(peers, fmt.Sprintf("%s %s (webhook %s): %s", wc.kind, wc.name, hook, peer))
			continue
		}
		return nil, fmt.Errorf("%s %s (webhook %s) admits %s LeaderWorkerSets: another LeaderWorkerSet controller serves the group; "+
			"uninstall it first, run without --leaderworkerset-api, or, if it runs no LeaderWorkerSet controller, label it %s=true",
			wc.kind, wc.name, hook, gv.Group, PeerWebhookLabel)
	}
	return peers, nil
}

type namedRules struct {
	name  string
	rules []admissionregistrationv1.RuleWithOperations
}

// webhookConfig is what the check reads of a mutating or validating webhook configuration.
type webhookConfig struct {
	kind, name string
	labels     map[string]string
	hooks      []namedRules
}

// leaderWorkerSetHook names the first webhook whose rules name leaderworkersets of group.
func (wc webhookConfig) leaderWorkerSetHook(group string) string {
	for _, h := range wc.hooks {
		if slices.ContainsFunc(h.rules, func(r admissionregistrationv1.RuleWithOperations) bool { return namesLeaderWorkerSets(r.Rule, group) }) {
			return h.name
		}
	}
	return ""
}

// peerOf says why a configuration belongs to a peer rather than to a LeaderWorkerSet controller,
// or "".
func (wc webhookConfig) peerOf() string {
	if wc.labels[PeerWebhookLabel] == "true" {
		return "labelled " + PeerWebhookLabel + "=true"
	}
	for _, h := range wc.hooks {
		for _, r := range h.rules {
			if slices.Contains(r.APIGroups, kueueGroup) {
				return "Kueue (webhook " + h.name + " admits " + kueueGroup + " objects)"
			}
		}
	}
	return ""
}

// namesLeaderWorkerSets says whether an admission rule names leaderworkersets of group itself.
// Wildcards do not count: a controller's webhook names its own resource, and "*" is how policy
// engines (Gatekeeper, Kyverno) ask to see everything.
func namesLeaderWorkerSets(r admissionregistrationv1.Rule, group string) bool {
	return slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, "leaderworkersets")
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
