package webhookcert

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	workloadsv1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/workloads/lws"
	"github.com/cistern-csi/cistern/pkg/workloads/nodevolume"
	"github.com/cistern-csi/cistern/pkg/workloads/notebook"
	"github.com/cistern-csi/cistern/pkg/workloads/placement"
)

// ConfigurationName names both webhook configurations.
const ConfigurationName = "cistern-workload-controller"

// ClientConfigFunc tells the API server how to reach one webhook path: through the Service in a
// cluster, or a URL when the controller runs outside one (tests, make demo).
type ClientConfigFunc func(path string) admissionregistrationv1.WebhookClientConfig

// ServiceClientConfig reaches the webhooks through a Service.
func ServiceClientConfig(namespace, name string, port int32) ClientConfigFunc {
	return func(path string) admissionregistrationv1.WebhookClientConfig {
		return admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
			Namespace: namespace, Name: name, Path: ptr.To(path), Port: ptr.To(port)}}
	}
}

// URLClientConfig reaches the webhooks at https://hostPort.
func URLClientConfig(hostPort string) ClientConfigFunc {
	return func(path string) admissionregistrationv1.WebhookClientConfig {
		return admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://" + hostPort + path)}
	}
}

func rule(gv schema.GroupVersion, resource string, ops ...admissionregistrationv1.OperationType) []admissionregistrationv1.RuleWithOperations {
	return []admissionregistrationv1.RuleWithOperations{{
		Operations: ops,
		Rule: admissionregistrationv1.Rule{APIGroups: []string{gv.Group}, APIVersions: []string{gv.Version},
			Resources: []string{resource}, Scope: ptr.To(admissionregistrationv1.NamespacedScope)},
	}}
}

// PodPlacement configures the pod placement webhook (pkg/workloads/placement).
type PodPlacement struct {
	// InstallNamespace is where Cistern runs: its pods are never sent to the webhook, nor are
	// kube-system's.
	InstallNamespace string
	// DriverName names the CSI driver whose inline volumes the webhook reads.
	DriverName string
}

// PlacementTimeoutSeconds is the pod placement webhook's timeout: a pod creation waits at most
// this long for it (placement.Budget is shorter, so the webhook answers first).
const PlacementTimeoutSeconds = 2

// Configurations are the webhook configurations the controller's server answers. caBundle may be
// nil (the controller injects it). lwsAPI is the group and version LeaderWorkerSet is served
// under (workloads.cistern.dev/v1alpha1, or leaderworkerset.x-k8s.io/v1 as the drop-in).
// podPlacement adds the pod placement webhook; nil leaves it out.
func Configurations(cc ClientConfigFunc, caBundle []byte, lwsAPI schema.GroupVersion, podPlacement *PodPlacement) (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration) {
	withCA := func(path string) admissionregistrationv1.WebhookClientConfig {
		c := cc(path)
		c.CABundle = caBundle
		return c
	}
	core := schema.GroupVersion{Version: "v1"}
	create, update := admissionregistrationv1.Create, admissionregistrationv1.Update
	fail := ptr.To(admissionregistrationv1.Fail)
	none := ptr.To(admissionregistrationv1.SideEffectClassNone)
	versions := []string{"v1"}
	mutating := &admissionregistrationv1.MutatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: ConfigurationName},
		Webhooks: []admissionregistrationv1.MutatingWebhook{
			{
				Name: "mleaderworkerset.workloads.cistern.dev", ClientConfig: withCA(lws.MutateLeaderWorkerSetPath),
				Rules: rule(lwsAPI, "leaderworkersets", create, update), FailurePolicy: fail, SideEffects: none,
				AdmissionReviewVersions: versions,
			},
			{
				// Only pods of a LeaderWorkerSet: every other pod creation in the cluster is untouched
				// even while the controller is down.
				Name: "mpod.workloads.cistern.dev", ClientConfig: withCA(lws.MutatePodPath),
				Rules: rule(core, "pods", create), FailurePolicy: fail, SideEffects: none,
				AdmissionReviewVersions: versions,
				ObjectSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
					Key: workloadsv1alpha1.SetNameLabelKey, Operator: metav1.LabelSelectorOpExists}}},
				ReinvocationPolicy: ptr.To(admissionregistrationv1.NeverReinvocationPolicy),
			},
		},
	}
	if podPlacement != nil {
		mutating.Webhooks = append(mutating.Webhooks, placementWebhook(withCA(placement.Path), *podPlacement))
	}
	validating := &admissionregistrationv1.ValidatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: ConfigurationName},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			{
				Name: "vleaderworkerset.workloads.cistern.dev", ClientConfig: withCA(lws.ValidateLeaderWorkerSetPath),
				Rules: rule(lwsAPI, "leaderworkersets", create, update), FailurePolicy: fail, SideEffects: none,
				AdmissionReviewVersions: versions,
			},
			{
				Name: "vnotebookvalidationjob.workloads.cistern.dev", ClientConfig: withCA(notebook.ValidatePath),
				Rules: rule(workloadsv1alpha1.GroupVersion, "notebookvalidationjobs", create, update), FailurePolicy: fail, SideEffects: none,
				AdmissionReviewVersions: versions,
			},
			nodeVolumeWebhook(withCA(nodevolume.Path)),
		},
	}
	return mutating, validating
}

// nodeVolumeWebhook sends the API server's PersistentVolume creations and updates by the node
// plugin's ServiceAccount, and no one else's, to pkg/workloads/nodevolume. It fails closed: while
// the controller is down, nodes provision no volume (their provisioners retry), rather than write
// volumes no one checked.
func nodeVolumeWebhook(cc admissionregistrationv1.WebhookClientConfig) admissionregistrationv1.ValidatingWebhook {
	return admissionregistrationv1.ValidatingWebhook{
		Name: "vnodepersistentvolume.workloads.cistern.dev", ClientConfig: cc,
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"},
				Resources: []string{"persistentvolumes"}, Scope: ptr.To(admissionregistrationv1.ClusterScope)},
		}},
		FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		AdmissionReviewVersions: []string{"v1"},
		MatchConditions: []admissionregistrationv1.MatchCondition{{
			Name: "cistern-node-service-account", Expression: nodevolume.ServiceAccountExpression}},
	}
}

// placementWebhook sends the API server only pod creations that may name a dataset (a claim, a
// generic ephemeral volume or an inline volume of the driver, and no node chosen yet), outside
// kube-system, the install namespace and namespaces labelled
// cistern.csi.dev/data-placement=disabled. A webhook that fails or is slow never holds a pod
// back: failurePolicy Ignore, a two-second timeout.
func placementWebhook(cc admissionregistrationv1.WebhookClientConfig, p PodPlacement) admissionregistrationv1.MutatingWebhook {
	return admissionregistrationv1.MutatingWebhook{
		Name: "mpodplacement.workloads.cistern.dev", ClientConfig: cc,
		Rules:                   rule(schema.GroupVersion{Version: "v1"}, "pods", admissionregistrationv1.Create),
		FailurePolicy:           ptr.To(admissionregistrationv1.Ignore),
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		TimeoutSeconds:          ptr.To[int32](PlacementTimeoutSeconds),
		AdmissionReviewVersions: []string{"v1"},
		NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: []string{metav1.NamespaceSystem, p.InstallNamespace}},
			{Key: consts.LabelDataPlacement, Operator: metav1.LabelSelectorOpNotIn, Values: []string{consts.DataPlacementDisabled}},
		}},
		MatchConditions: []admissionregistrationv1.MatchCondition{{
			Name: "may-name-a-dataset",
			Expression: "(!has(object.spec.nodeName) || object.spec.nodeName == '') && has(object.spec.volumes) && " +
				"object.spec.volumes.exists(v, has(v.persistentVolumeClaim) || has(v.ephemeral) || " +
				"(has(v.csi) && v.csi.driver == '" + p.DriverName + "'))",
		}},
		// Volumes and node names are not what other webhooks change; running once is enough.
		ReinvocationPolicy: ptr.To(admissionregistrationv1.NeverReinvocationPolicy),
	}
}
