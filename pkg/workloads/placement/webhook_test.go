package placement

import (
	"context"
	"errors"
	"testing"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/params"
)

const ns = "team"

var datasetParams = map[string]string{"pool": "fast", "source": "s3://datasets/sample/", "endpoint": "http://127.0.0.1:9000", "pathStyle": "true"}

func datasetID(t *testing.T, m map[string]string) string {
	t.Helper()
	v, err := params.Parse(m, params.StorageClass)
	if err != nil || v.Dataset == nil {
		t.Fatalf("params %v: %v", m, err)
	}
	return v.Dataset.ID()
}

func pool(name, node string, ids []string, healthy metav1.ConditionStatus, labels map[string]string) *spapi.StoragePool {
	p := &spapi.StoragePool{
		ObjectMeta: metav1.ObjectMeta{Name: name + "." + node, Labels: map[string]string{consts.LabelPool: name, consts.LabelNode: node}},
		Spec:       spapi.StoragePoolSpec{Driver: consts.DriverName, Parameters: map[string]string{consts.ParamPool: name}},
		Status: spapi.StoragePoolStatus{AccessibleNodes: []string{node},
			Conditions: []metav1.Condition{{Type: spapi.ConditionHealthy, Status: healthy}}},
	}
	for k, v := range labels {
		p.Labels[k] = v
	}
	for _, id := range ids {
		p.Labels[consts.LabelDatasetPrefix+id] = "true"
	}
	return p
}

func class(name, provisioner string, parameters map[string]string) *storagev1.StorageClass {
	return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner, Parameters: parameters,
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)}
}

func claim(name, class, volume string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: ptr.To(class), VolumeName: volume}}
}

func claimPod(claims ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}}
	for _, c := range claims {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: c, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c}}})
	}
	return p
}

// warmTerm is the term the webhook must add for nodes, written out rather than built by Term, so
// that a change to Term (its weight, key or operator) fails the tests that expect it.
func warmTerm(nodes ...string) corev1.PreferredSchedulingTerm {
	return corev1.PreferredSchedulingTerm{Weight: 1, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{
		Key: "topology.cistern.csi.dev/node", Operator: "In", Values: nodes}}}}
}

func preferred(terms ...corev1.PreferredSchedulingTerm) *corev1.Affinity {
	return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: terms}}
}

func TestWebhook(t *testing.T) {
	id := datasetID(t, datasetParams)
	other := datasetID(t, map[string]string{"source": "s3://datasets/other/"})
	userTerm := corev1.PreferredSchedulingTerm{Weight: 80, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}}
	required := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: "gpu", Operator: corev1.NodeSelectorOpExists}}}}}
	objects := []client.Object{
		class("data", consts.DriverName, datasetParams),
		class("data-any-pool", consts.DriverName, map[string]string{"source": "s3://datasets/other/"}),
		class("data-ssd", consts.DriverName, map[string]string{"poolSelector": "media=ssd", "source": "s3://datasets/other/"}),
		class("plain", consts.DriverName, map[string]string{"pool": "fast"}),
		class("foreign", "other.csi.dev", datasetParams),
		claim("wffc", "data", ""),
		claim("wffc-any", "data-any-pool", ""),
		claim("wffc-ssd", "data-ssd", ""),
		claim("empty", "plain", ""),
		claim("foreign", "foreign", ""),
		claim("bound", "data", "pv-bound"),
		&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-bound"}, Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: consts.DriverName, VolumeHandle: "fast-1",
				VolumeAttributes: map[string]string{"pool": "fast", "source": "s3://datasets/sample/", "endpoint": "http://127.0.0.1:9000",
					"pathStyle": "true", "storage.kubernetes.io/csiProvisionerIdentity": "123-node-b"}}}}},
		claim("vm", "", "cistern-vm-pv"),
		&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "cistern-vm-pv"}, Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: consts.DriverName, VolumeHandle: consts.VolumeManagerHandlePrefix + "0123456789abcdef",
				VolumeAttributes: map[string]string{"source": "s3://datasets/other/", "capacity": "1073741824"}}}}},
		pool("fast", "node-b", []string{id}, metav1.ConditionTrue, nil),
		pool("fast", "node-c", []string{id}, metav1.ConditionTrue, nil),
		pool("bulk", "node-a", []string{id, other}, metav1.ConditionTrue, map[string]string{"media": "hdd"}),
		pool("fast", "node-d", []string{id}, metav1.ConditionFalse, nil),
		pool("fast", "node-e", []string{other}, metav1.ConditionTrue, map[string]string{"media": "ssd"}),
	}
	warm := warmTerm("node-b", "node-c")
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want *corev1.Affinity
	}{
		{"WaitForFirstConsumer claim: the class's dataset, in its pool, on healthy pools", claimPod("wffc"), preferred(warm)},
		{"bound claim: the PV's attributes", claimPod("bound"), preferred(warm)},
		{"class without a pool: any pool holding it", claimPod("wffc-any"), preferred(warmTerm("node-a", "node-e"))},
		{"class with a pool selector: pools matching it", claimPod("wffc-ssd"), preferred(warmTerm("node-e"))},
		{"two datasets: one term each; a claim used twice counts once", claimPod("wffc", "wffc-any", "bound"),
			preferred(warm, warmTerm("node-a", "node-e"))},
		// A pod author's own source: the webhook is no oracle of where a guessed dataset is
		// cached, on a real or a dry-run create.
		{"failure case - inline volume of the driver: unchanged", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}, Spec: corev1.PodSpec{
			Volumes: []corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
				Driver: consts.DriverName, VolumeAttributes: map[string]string{"source": "s3://datasets/other/", "size": "1Gi"}}}}}}},
			nil},
		{"failure case - a VolumeManager's claim: unchanged", claimPod("vm"), nil},
		{"generic ephemeral volume: its class", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}, Spec: corev1.PodSpec{
			Volumes: []corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{
				VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: ptr.To("data")}}}}}}}},
			preferred(warm)},
		{"the user's affinity is kept, ours appended", func() *corev1.Pod {
			p := claimPod("wffc")
			p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: required,
				PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{userTerm}}}
			return p
		}(), &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: required,
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{userTerm, warm}}}},
		{"admitted again: no second term", func() *corev1.Pod { p := claimPod("wffc"); p.Spec.Affinity = preferred(warm); return p }(), preferred(warm)},
		{"no node holds the dataset: unchanged", claimPod("empty"), nil},
		{"another driver's class: unchanged", claimPod("foreign"), nil},
		{"claim not created yet: unchanged", claimPod("missing"), nil},
		{"pod already bound to a node: unchanged", func() *corev1.Pod { p := claimPod("wffc"); p.Spec.NodeName = "node-x"; return p }(), nil},
		{"inline volume the driver would refuse: unchanged", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}, Spec: corev1.PodSpec{
			Volumes: []corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
				Driver: consts.DriverName, VolumeAttributes: map[string]string{"source": "file:///etc"}}}}}}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) { admitAndCompare(t, objects, tc.pod, tc.want) })
	}
}

// admitAndCompare admits a copy of pod through a webhook reading objects and compares the affinity
// it leaves with want.
func admitAndCompare(t *testing.T, objects []client.Object, pod *corev1.Pod, want *corev1.Affinity) {
	t.Helper()
	w := &Webhook{Reader: fake.NewClientBuilder().WithScheme(scheme(t)).WithObjects(objects...).Build(), DriverName: consts.DriverName}
	pod = pod.DeepCopy()
	if err := w.Default(context.Background(), pod); err != nil {
		t.Fatalf("Default: %v", err)
	}
	if !equality.Semantic.DeepEqual(pod.Spec.Affinity, want) {
		t.Errorf("affinity\n got %+v\nwant %+v", pod.Spec.Affinity, want)
	}
}

// The webhook never refuses a pod: when the API server fails it, the pod goes through unchanged.
func TestWebhookAdmitsOnErrors(t *testing.T) {
	for _, failing := range []string{"get", "list"} {
		t.Run("failure case - "+failing+" fails", func(t *testing.T) {
			boom := errors.New("etcd is on fire")
			c := fake.NewClientBuilder().WithScheme(scheme(t)).
				WithObjects(class("data", consts.DriverName, datasetParams), claim("wffc", "data", ""),
					pool("fast", "node-b", []string{datasetID(t, datasetParams)}, metav1.ConditionTrue, nil)).
				WithInterceptorFuncs(interceptor.Funcs{
					Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
						if failing == "get" {
							return boom
						}
						return c.Get(ctx, key, obj, opts...)
					},
					List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
						if failing == "list" {
							return boom
						}
						return c.List(ctx, list, opts...)
					},
				}).Build()
			pod := claimPod("wffc")
			if err := (&Webhook{Reader: c, DriverName: consts.DriverName}).Default(context.Background(), pod); err != nil {
				t.Fatalf("Default: %v", err)
			}
			if pod.Spec.Affinity != nil {
				t.Errorf("affinity %+v, want none", pod.Spec.Affinity)
			}
		})
	}
}

func TestPreferBoundsNodes(t *testing.T) {
	many := make([]string, MaxNodes+1)
	for i := range many {
		many[i] = "n" + string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	pod := &corev1.Pod{}
	if Prefer(pod, [][]string{many, nil}) || pod.Spec.Affinity != nil {
		t.Errorf("a dataset on %d nodes, or on none, added %+v", len(many), pod.Spec.Affinity)
	}
	if !Prefer(pod, [][]string{many[:MaxNodes]}) {
		t.Errorf("a dataset on %d nodes added no term", MaxNodes)
	}
}

func scheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := spapi.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := snapv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}
