package placement

import (
	"context"
	"errors"
	"testing"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/ids"
)

// snapshot returns a VolumeSnapshot in ns and its content: bound (status) when bound, else
// pre-provisioned (the snapshot names the content, the content has the handle in its spec).
func snapshot(name, driver, handle string, bound bool) (*snapv1.VolumeSnapshot, *snapv1.VolumeSnapshotContent) {
	vs := &snapv1.VolumeSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	c := &snapv1.VolumeSnapshotContent{ObjectMeta: metav1.ObjectMeta{Name: "content-" + name}, Spec: snapv1.VolumeSnapshotContentSpec{
		Driver: driver, DeletionPolicy: snapv1.VolumeSnapshotContentDelete,
		VolumeSnapshotRef: corev1.ObjectReference{Namespace: ns, Name: name},
	}}
	if bound {
		vs.Spec.Source.PersistentVolumeClaimName = ptr.To("src")
		vs.Status = &snapv1.VolumeSnapshotStatus{BoundVolumeSnapshotContentName: ptr.To(c.Name)}
		c.Spec.Source.VolumeHandle = ptr.To("fast-0123")
		c.Status = &snapv1.VolumeSnapshotContentStatus{SnapshotHandle: ptr.To(handle)}
	} else {
		vs.Spec.Source.VolumeSnapshotContentName = ptr.To(c.Name)
		c.Spec.Source.SnapshotHandle = ptr.To(handle)
	}
	return vs, c
}

func restoreClaim(name, class, kind, source string) *corev1.PersistentVolumeClaim {
	pvc := claim(name, class, "")
	group := snapv1.GroupName
	if kind == "PersistentVolumeClaim" {
		group = ""
	}
	pvc.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: kind, Name: source}
	if group == "" {
		pvc.Spec.DataSourceRef.APIGroup = nil
	}
	return pvc
}

func pinnedPV(name, driver string, nodes ...string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{
		PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: "fast-" + name}},
		NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{Requirement(nodes)}}}}},
	}}
}

func required(terms ...corev1.NodeSelectorTerm) *corev1.Affinity {
	return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms}}}
}

func onNodes(nodes ...string) corev1.NodeSelectorTerm {
	return corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{Requirement(nodes)}}
}

func TestWebhookSources(t *testing.T) {
	id := datasetID(t, datasetParams)
	snapB, contentB := snapshot("snap-b", consts.DriverName, ids.NewSnapshotID("fast", "node-b"), true)
	preB, preContentB := snapshot("pre-b", consts.DriverName, ids.NewSnapshotID("fast", "node-b"), false)
	snapA, contentA := snapshot("snap-a", consts.DriverName, ids.NewSnapshotID("fast", "node-a"), true)
	labelled, labelledContent := snapshot("labelled", consts.DriverName, "fast-snap-0123456789abcdef0123456789abcdef", true)
	labelledContent.Labels = map[string]string{consts.LabelSnapshotManagedBy: "node-c"}
	foreign, foreignContent := snapshot("foreign", "other.csi.dev", ids.NewSnapshotID("fast", "node-b"), true)
	stolen, _ := snapshot("stolen", consts.DriverName, "", true)
	stolen.Status.BoundVolumeSnapshotContentName = ptr.To(contentB.Name) // a content bound to another snapshot
	unbound := &snapv1.VolumeSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unbound"}}
	elsewhere, elsewhereContent := snapshot("elsewhere", consts.DriverName, ids.NewSnapshotID("fast", "node-b"), true)
	elsewhere.Namespace, elsewhereContent.Spec.VolumeSnapshotRef.Namespace = "other", "other"
	legacy := restoreClaim("legacy", "plain", "VolumeSnapshot", "snap-b")
	legacy.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: ptr.To(snapv1.GroupName), Kind: "VolumeSnapshot", Name: "snap-b"}
	legacy.Spec.DataSourceRef = nil
	objects := []client.Object{
		class("plain", consts.DriverName, map[string]string{"pool": "fast"}),
		class("data", consts.DriverName, datasetParams),
		class("foreign", "other.csi.dev", nil),
		snapB, contentB, preB, preContentB, snapA, contentA, labelled, labelledContent, foreign, foreignContent, stolen, unbound, elsewhere, elsewhereContent,
		restoreClaim("from-b", "plain", "VolumeSnapshot", "snap-b"),
		restoreClaim("from-pre-b", "plain", "VolumeSnapshot", "pre-b"),
		restoreClaim("from-b-too", "plain", "VolumeSnapshot", "snap-b"),
		restoreClaim("from-a", "plain", "VolumeSnapshot", "snap-a"),
		restoreClaim("from-labelled", "plain", "VolumeSnapshot", "labelled"),
		restoreClaim("from-foreign", "plain", "VolumeSnapshot", "foreign"),
		restoreClaim("from-stolen", "plain", "VolumeSnapshot", "stolen"),
		restoreClaim("from-unbound", "plain", "VolumeSnapshot", "unbound"),
		restoreClaim("from-missing", "plain", "VolumeSnapshot", "missing"),
		restoreClaim("foreign-class", "foreign", "VolumeSnapshot", "snap-b"),
		legacy,
		func() *corev1.PersistentVolumeClaim {
			c := restoreClaim("bound-restore", "plain", "VolumeSnapshot", "snap-b")
			c.Spec.VolumeName = "pv-b"
			return c
		}(),
		claim("src-a", "plain", "pv-a"), pinnedPV("pv-a", consts.DriverName, "node-a"),
		claim("src-foreign", "foreign", "pv-foreign"), pinnedPV("pv-foreign", "other.csi.dev", "node-a"),
		claim("src-unbound", "plain", ""),
		pinnedPV("pv-b", consts.DriverName, "node-b"),
		restoreClaim("clone-a", "plain", "PersistentVolumeClaim", "src-a"),
		restoreClaim("clone-foreign", "plain", "PersistentVolumeClaim", "src-foreign"),
		restoreClaim("clone-unbound", "plain", "PersistentVolumeClaim", "src-unbound"),
		func() *corev1.PersistentVolumeClaim {
			c := restoreClaim("from-other-namespace", "plain", "VolumeSnapshot", "elsewhere")
			c.Spec.DataSourceRef.Namespace = ptr.To("other")
			return c
		}(),
		func() *corev1.PersistentVolumeClaim {
			c := restoreClaim("from-own-namespace", "plain", "VolumeSnapshot", "snap-b")
			c.Spec.DataSourceRef.Namespace = ptr.To(ns)
			return c
		}(),
		claim("wffc", "data", ""),
		pool("fast", "node-b", []string{id}, metav1.ConditionTrue, nil),
	}
	gpu := corev1.NodeSelectorRequirement{Key: "gpu", Operator: corev1.NodeSelectorOpExists}
	zone := corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}
	host := corev1.NodeSelectorRequirement{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-b"}}
	ephemeral := func(kind, source string) *corev1.Pod {
		r := restoreClaim("", "plain", kind, source)
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}, Spec: corev1.PodSpec{
			Volumes: []corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{
				VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{Spec: r.Spec}}}}}}}
	}
	withAffinity := func(p *corev1.Pod, a *corev1.Affinity) *corev1.Pod { p.Spec.Affinity = a; return p }
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want *corev1.Affinity
	}{
		{"restore of a bound snapshot: its node, from the content's status", claimPod("from-b"), required(onNodes("node-b"))},
		{"restore of a pre-provisioned snapshot: its node, from the content's spec", claimPod("from-pre-b"), required(onNodes("node-b"))},
		{"restore through the dataSource field", claimPod("legacy"), required(onNodes("node-b"))},
		{"handle naming no node: the content's managed-by label", claimPod("from-labelled"), required(onNodes("node-c"))},
		{"clone of a bound claim: its PV's node", claimPod("clone-a"), required(onNodes("node-a"))},
		{"generic ephemeral volume restoring a snapshot", ephemeral("VolumeSnapshot", "snap-b"), required(onNodes("node-b"))},
		{"generic ephemeral volume cloning a claim", ephemeral("PersistentVolumeClaim", "src-a"), required(onNodes("node-a"))},
		{"two restores from one node: one requirement", claimPod("from-b", "from-b-too"), required(onNodes("node-b"))},
		{"a restore and a dataset: required and preferred", claimPod("from-b", "wffc"),
			&corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution:  &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{onNodes("node-b")}},
				PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{warmTerm("node-b")}}}},
		{"the user's required terms each get the requirement; an empty term stays empty; preferred terms kept",
			withAffinity(claimPod("from-b"), &corev1.Affinity{
				NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
					{MatchExpressions: []corev1.NodeSelectorRequirement{gpu}}, {MatchExpressions: []corev1.NodeSelectorRequirement{zone}},
					{MatchFields: []corev1.NodeSelectorRequirement{host}}, {}}},
					PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 5, Preference: onNodes("node-x")}}},
				PodAffinity: &corev1.PodAffinity{}}),
			&corev1.Affinity{
				NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
					{MatchExpressions: []corev1.NodeSelectorRequirement{gpu, Requirement([]string{"node-b"})}},
					{MatchExpressions: []corev1.NodeSelectorRequirement{zone, Requirement([]string{"node-b"})}},
					{MatchFields: []corev1.NodeSelectorRequirement{host}, MatchExpressions: []corev1.NodeSelectorRequirement{Requirement([]string{"node-b"})}}, {}}},
					PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 5, Preference: onNodes("node-x")}}},
				PodAffinity: &corev1.PodAffinity{}}},
		{"admitted again: unchanged", withAffinity(claimPod("from-b"), required(onNodes("node-b"))), required(onNodes("node-b"))},
		{"failure case - restores from two nodes: nothing required (the provisioners say why)", claimPod("from-b", "from-a"), nil},
		{"another driver's snapshot: unchanged", claimPod("from-foreign"), nil},
		{"a content bound to another snapshot: unchanged", claimPod("from-stolen"), nil},
		{"snapshot not bound yet: unchanged", claimPod("from-unbound"), nil},
		{"snapshot not created yet: unchanged", claimPod("from-missing"), nil},
		{"claim of another driver's class: unchanged", claimPod("foreign-class"), nil},
		{"claim already bound: its PV pins it, unchanged", claimPod("bound-restore"), nil},
		{"clone of another driver's volume: unchanged", claimPod("clone-foreign"), nil},
		{"clone of a claim not bound yet: unchanged", claimPod("clone-unbound"), nil},
		{"a source in another namespace (its ReferenceGrant unchecked here): unchanged", claimPod("from-other-namespace"), nil},
		{"a source naming the claim's own namespace", claimPod("from-own-namespace"), required(onNodes("node-b"))},
	} {
		t.Run(tc.name, func(t *testing.T) { admitAndCompare(t, objects, tc.pod, tc.want) })
	}
}

// Snapshots are read only for claims of the driver's classes, and a snapshot that cannot be read
// (no CRDs, no RBAC, the API server failing) leaves the pod as it was.
func TestWebhookSourcesReadOnlyForTheDriver(t *testing.T) {
	id := datasetID(t, datasetParams)
	snapB, contentB := snapshot("snap-b", consts.DriverName, ids.NewSnapshotID("fast", "node-b"), true)
	build := func(t *testing.T) *Webhook {
		c := fake.NewClientBuilder().WithScheme(scheme(t)).WithObjects(
			class("data", consts.DriverName, datasetParams), class("plain", consts.DriverName, nil), class("foreign", "other.csi.dev", nil),
			claim("wffc", "data", ""), restoreClaim("foreign-class", "foreign", "VolumeSnapshot", "snap-b"),
			restoreClaim("from-b", "plain", "VolumeSnapshot", "snap-b"), snapB, contentB,
			pool("fast", "node-b", []string{id}, metav1.ConditionTrue, nil)).
			WithInterceptorFuncs(interceptor.Funcs{
				Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					if _, ok := obj.(*snapv1.VolumeSnapshot); ok {
						return errors.New("no matches for kind VolumeSnapshot")
					}
					return c.Get(ctx, key, obj, opts...)
				},
			}).Build()
		return &Webhook{Reader: c, DriverName: consts.DriverName}
	}
	pod := claimPod("wffc", "foreign-class")
	if err := build(t).Default(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(pod.Spec.Affinity, preferred(warmTerm("node-b"))) {
		t.Errorf("another driver's restore was looked up: affinity %+v", pod.Spec.Affinity)
	}
	pod = claimPod("wffc", "from-b")
	if err := build(t).Default(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	if pod.Spec.Affinity != nil {
		t.Errorf("failure case - snapshot unreadable: affinity %+v, want the pod unchanged", pod.Spec.Affinity)
	}
}

func TestNodesOf(t *testing.T) {
	term := func(reqs ...corev1.NodeSelectorRequirement) corev1.NodeSelectorTerm {
		return corev1.NodeSelectorTerm{MatchExpressions: reqs}
	}
	in := func(key string, nodes ...string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: key, Operator: corev1.NodeSelectorOpIn, Values: nodes}
	}
	affinity := func(terms ...corev1.NodeSelectorTerm) *corev1.VolumeNodeAffinity {
		return &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: terms}}
	}
	key := consts.TopologyKey
	for _, tc := range []struct {
		name string
		a    *corev1.VolumeNodeAffinity
		want []string
	}{
		{"no affinity", nil, nil},
		{"no required terms", &corev1.VolumeNodeAffinity{}, nil},
		{"one node, as the provisioner pins a volume", affinity(term(in(key, "node-a"))), []string{"node-a"}},
		{"several nodes, sorted", affinity(term(in(key, "node-c", "node-a"))), []string{"node-a", "node-c"}},
		{"terms are ORed: their union", affinity(term(in(key, "node-b")), term(in(key, "node-a", "node-b"))), []string{"node-a", "node-b"}},
		{"expressions are ANDed: their intersection", affinity(term(in(key, "node-a", "node-b"), in("zone", "x"), in(key, "node-b", "node-c"))), []string{"node-b"}},
		{"a term without the key: reachable elsewhere", affinity(term(in(key, "node-a")), term(in("zone", "x"))), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NodesOf(tc.a); !equality.Semantic.DeepEqual(got, tc.want) {
				t.Errorf("NodesOf = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCommon(t *testing.T) {
	for _, tc := range []struct {
		sets [][]string
		want []string
	}{
		{nil, nil},
		{[][]string{{"b", "a"}}, []string{"a", "b"}},
		{[][]string{{"a", "b"}, {"b", "c"}}, []string{"b"}},
		{[][]string{{"a"}, {"b"}}, []string{}},
	} {
		if got := Common(tc.sets); len(got) != len(tc.want) || (len(got) > 0 && !equality.Semantic.DeepEqual(got, tc.want)) {
			t.Errorf("Common(%v) = %v, want %v", tc.sets, got, tc.want)
		}
	}
}

func TestRequireBoundsNodes(t *testing.T) {
	many := make([]string, MaxNodes+1)
	for i := range many {
		many[i] = "n" + string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	pod := &corev1.Pod{}
	if Require(pod, many) || Require(pod, nil) || pod.Spec.Affinity != nil {
		t.Errorf("%d nodes, or none, added %+v", len(many), pod.Spec.Affinity)
	}
}
