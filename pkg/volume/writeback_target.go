package volume

import (
	"maps"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/writeback"
)

// Output targets (docs/datasets.md, "Write-back"): what a volume's outputTarget names once its
// placeholders are replaced. A StorageClass's target may name the claim (${pvc.namespace},
// ${pvc.name}, ${pv.name}): replaced once, at CreateVolume, and recorded in the volume's
// parameters, so that each claim of a class writes a prefix of its own and its PV shows which.
// An inline volume's or a static PV's may name the pod (${pod.namespace}, ${pod.name}),
// replaced at each use from what kubelet passes. An NFS target of a tenant's volume is written
// below its namespace's directory of the export (writeback.Target.Namespace): NFSv3 knows no
// tenant, and every one writes as the node's one NFS identity.

var (
	podVars   = []struct{ name, key string }{{consts.PodNamespaceVar, consts.VolumeContextPodNamespace}, {consts.PodNameVar, consts.VolumeContextPodName}}
	claimVars = []struct{ name, key string }{{consts.PVCNamespaceVar, consts.ParamPVCNamespace}, {consts.PVCNameVar, consts.ParamPVCName}, {consts.PVNameVar, consts.ParamPVName}}
)

// placeholderValue says whether val may replace a placeholder: one path segment, as the names
// of Kubernetes objects are.
func placeholderValue(val string) bool {
	return val != "" && val != "." && val != ".." && !strings.ContainsAny(val, "/${}")
}

// outputTarget is an output target with the pod's placeholders replaced and, for an NFS target
// of a tenant's volume (an inline volume, a VolumeManager's), confined to the pod's namespace.
func outputTarget(raw string, attrs map[string]string, tenant bool) (writeback.Target, error) {
	for _, v := range podVars {
		if strings.Contains(raw, v.name) {
			val := attrs[v.key]
			if !placeholderValue(val) {
				return writeback.Target{}, status.Errorf(codes.InvalidArgument, "%s %q uses %s, but kubelet passed no pod information (podInfoOnMount)", consts.ParamOutputTarget, raw, v.name)
			}
			raw = strings.ReplaceAll(raw, v.name, val)
		}
	}
	if strings.Contains(raw, "${") {
		return writeback.Target{}, status.Errorf(codes.InvalidArgument, "%s %q holds a placeholder this volume has no value for: inline volumes and static PVs take %s and %s; a StorageClass's target may name its claims with %s, %s and %s",
			consts.ParamOutputTarget, raw, consts.PodNamespaceVar, consts.PodNameVar, consts.PVCNamespaceVar, consts.PVCNameVar, consts.PVNameVar)
	}
	t, err := writeback.ParseTarget(raw)
	if err != nil {
		return writeback.Target{}, status.Error(codes.InvalidArgument, err.Error())
	}
	if t.NFS() && tenant {
		ns := attrs[consts.VolumeContextPodNamespace]
		if !placeholderValue(ns) {
			return writeback.Target{}, status.Errorf(codes.InvalidArgument, "%s %q: a tenant's NFS target is written below its namespace's directory of the export, but kubelet passed no pod namespace (podInfoOnMount)", consts.ParamOutputTarget, raw)
		}
		t.Namespace = ns
	}
	return t, nil
}

// tenantOutput says whether a volume of spec's dataset is a tenant's (an inline volume, a
// VolumeManager's): its NFS target is confined to its namespace.
func tenantOutput(spec *datasource.Spec) bool {
	return spec != nil && (spec.Tenant || spec.Inline)
}

// claimParameters are CreateVolume's parameters with the claim's placeholders in the output
// target replaced from the claim and volume external-provisioner names there
// (--extra-create-metadata): what the volume records and returns as its context. Parameters
// whose target names no placeholder come back as they are.
func claimParameters(p map[string]string) (map[string]string, error) {
	raw := p[consts.ParamOutputTarget]
	if !strings.Contains(raw, "${") {
		return p, nil
	}
	for _, v := range claimVars {
		if strings.Contains(raw, v.name) {
			val := p[v.key]
			if !placeholderValue(val) {
				return nil, status.Errorf(codes.InvalidArgument, "%s %q uses %s, but CreateVolume names no claim (external-provisioner passes it with --extra-create-metadata)", consts.ParamOutputTarget, raw, v.name)
			}
			raw = strings.ReplaceAll(raw, v.name, val)
		}
	}
	if strings.Contains(raw, "${") {
		return nil, status.Errorf(codes.InvalidArgument, "%s %q holds a placeholder a claim has no value for: a StorageClass's target takes %s, %s and %s (%s and %s are for inline volumes and static PVs: NodeStageVolume knows no pod)",
			consts.ParamOutputTarget, p[consts.ParamOutputTarget], consts.PVCNamespaceVar, consts.PVCNameVar, consts.PVNameVar, consts.PodNamespaceVar, consts.PodNameVar)
	}
	out := maps.Clone(p)
	out[consts.ParamOutputTarget] = raw
	return out, nil
}

// namespaceOf is the namespace whose outputs a volume holds: its pod's (inline volumes, static
// PV copies), else its claim's; "" when neither is known.
func namespaceOf(attrs map[string]string) string {
	if ns := attrs[consts.VolumeContextPodNamespace]; ns != "" {
		return ns
	}
	return attrs[consts.ParamPVCNamespace]
}
