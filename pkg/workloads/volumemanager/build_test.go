package volumemanager

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
)

func TestDatasetAttributes(t *testing.T) {
	cfg := Config{LocalSourceRoots: []string{"/srv/datasets/"}, NFSServers: []string{"server"}}
	tests := []struct {
		name    string
		vc      datav1alpha1.VolumeConfig
		want    map[string]string
		wantErr string
	}{
		{name: "s3 with options", vc: datav1alpha1.VolumeConfig{SourceType: "S3", SourceURL: "s3://bucket/prefix",
			Options: map[string]string{"endpoint": "http://127.0.0.1:9000", "region": "us-east-1", "pathStyle": "true",
				"include": "*.parquet", "exclude": "tmp/*", "secretName": "creds", "other": "ignored"}},
			want: map[string]string{consts.ParamCapacity: "1Gi", consts.ParamSource: "s3://bucket/prefix", consts.ParamEndpoint: "http://127.0.0.1:9000",
				consts.ParamRegion: "us-east-1", consts.ParamPathStyle: "true", consts.ParamInclude: "*.parquet", consts.ParamExclude: "tmp/*"}},
		{name: "nfs", vc: datav1alpha1.VolumeConfig{SourceType: "NFS", SourceURL: "nfs://server/export/data"},
			want: map[string]string{consts.ParamCapacity: "1Gi", consts.ParamSource: "nfs://server/export/data"}},
		{name: "nfs version 4", vc: datav1alpha1.VolumeConfig{SourceType: "NFS", SourceURL: "nfs://server/data", Options: map[string]string{"nfsVersion": "4"}},
			want: map[string]string{consts.ParamCapacity: "1Gi", consts.ParamSource: "nfs://server/data", consts.ParamNFSVersion: "4"}},
		{name: "failure case - nfs server not allowed", vc: datav1alpha1.VolumeConfig{SourceType: "NFS", SourceURL: "nfs://10.0.0.9/export"},
			wantErr: "NFS server 10.0.0.9 is not allowed"},
		{name: "local under an allowed root", vc: datav1alpha1.VolumeConfig{SourceType: "Local", SourceURL: "file:///srv/datasets/imagenet"},
			want: map[string]string{consts.ParamCapacity: "1Gi", consts.ParamSource: "file:///srv/datasets/imagenet"}},
		{name: "failure case - local outside the roots", vc: datav1alpha1.VolumeConfig{SourceType: "Local", SourceURL: "file:///etc"},
			wantErr: `path "/etc" is not under an allowed root (/srv/datasets/)`},
		{name: "failure case - local escaping with ..", vc: datav1alpha1.VolumeConfig{SourceType: "Local", SourceURL: "file:///srv/datasets/../../etc"},
			wantErr: "must be absolute without '..'"},
		{name: "failure case - local with a host", vc: datav1alpha1.VolumeConfig{SourceType: "Local", SourceURL: "file://node/srv/datasets"},
			wantErr: "file:// URLs take no host"},
		{name: "failure case - type and scheme disagree", vc: datav1alpha1.VolumeConfig{SourceType: "S3", SourceURL: "nfs://x/y"},
			wantErr: "a S3 source must start with s3://"},
		{name: "failure case - s3 without bucket", vc: datav1alpha1.VolumeConfig{SourceType: "S3", SourceURL: "s3:///prefix"},
			wantErr: "names no bucket"},
		{name: "failure case - bad endpoint, as the driver says", vc: datav1alpha1.VolumeConfig{SourceType: "S3", SourceURL: "s3://b/p",
			Options: map[string]string{"endpoint": "minio:9000"}},
			wantErr: `endpoint "minio:9000" is not an http(s) URL`},
		{name: "failure case - bad pattern, as the driver says", vc: datav1alpha1.VolumeConfig{SourceType: "S3", SourceURL: "s3://b/p",
			Options: map[string]string{"include": "[a"}},
			wantErr: "[a"},
		{name: "failure case - zero capacity", vc: datav1alpha1.VolumeConfig{SourceType: "S3", SourceURL: "s3://b/p",
			Capacity: ptr.To(resource.MustParse("0"))}, wantErr: "capacity 0 is not more than 0"},
		{name: "s3 output target with checkpoints and deletions", vc: datav1alpha1.VolumeConfig{SourceType: "S3", SourceURL: "s3://b/p",
			AccessMode: corev1.ReadWriteOnce, OutputTarget: "s3://results/${pod.namespace}/${pod.name}", OutputDeletions: true,
			OutputInterval: &metav1.Duration{Duration: 10 * time.Minute}},
			want: map[string]string{consts.ParamCapacity: "1Gi", consts.ParamSource: "s3://b/p", consts.ParamOutputTarget: "s3://results/${pod.namespace}/${pod.name}",
				consts.ParamOutputDeletions: "true", consts.ParamOutputInterval: "10m0s"}},
		{name: "nfs output target of an allowed server", vc: datav1alpha1.VolumeConfig{SourceType: "NFS", SourceURL: "nfs://server/export/data",
			AccessMode: corev1.ReadWriteMany, OutputTarget: "nfs://server/export/out"},
			want: map[string]string{consts.ParamCapacity: "1Gi", consts.ParamSource: "nfs://server/export/data", consts.ParamOutputTarget: "nfs://server/export/out"}},
		{name: "failure case - output target of a read-only volume", vc: datav1alpha1.VolumeConfig{SourceType: "S3", SourceURL: "s3://b/p",
			OutputTarget: "s3://results/x"}, wantErr: "outputTarget needs a writer accessMode"},
		{name: "failure case - nfs output server not allowed", vc: datav1alpha1.VolumeConfig{SourceType: "S3", SourceURL: "s3://b/p",
			AccessMode: corev1.ReadWriteOnce, OutputTarget: "nfs://10.0.0.9/export"}, wantErr: "NFS server 10.0.0.9 is not allowed"},
		{name: "failure case - s3 output target of an nfs dataset", vc: datav1alpha1.VolumeConfig{SourceType: "NFS", SourceURL: "nfs://server/export/data",
			AccessMode: corev1.ReadWriteOnce, OutputTarget: "s3://results/x"}, wantErr: "a NFS dataset has none"},
		{name: "failure case - output target naming a claim", vc: datav1alpha1.VolumeConfig{SourceType: "S3", SourceURL: "s3://b/p",
			AccessMode: corev1.ReadWriteOnce, OutputTarget: "s3://results/${pvc.name}"}, wantErr: "placeholder the node has no value for"},
		{name: "failure case - output target of another scheme", vc: datav1alpha1.VolumeConfig{SourceType: "S3", SourceURL: "s3://b/p",
			AccessMode: corev1.ReadWriteOnce, OutputTarget: "http://results/x"}, wantErr: "is not s3://bucket"},
		{name: "failure case - capacity above 1Pi", vc: datav1alpha1.VolumeConfig{SourceType: "S3", SourceURL: "s3://b/p",
			Capacity: ptr.To(resource.MustParse("2Pi"))}, wantErr: "at most 1Pi"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DatasetAttributes(&tc.vc, cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("attributes (-want +got):\n%s", d)
			}
		})
	}
	// The administrator's bound replaces the default one.
	limited := cfg
	limited.MaxCapacity = resource.MustParse("100Gi")
	if _, err := DatasetAttributes(&datav1alpha1.VolumeConfig{SourceType: "S3", SourceURL: "s3://b/p",
		Capacity: ptr.To(resource.MustParse("101Gi"))}, limited); err == nil || !strings.Contains(err.Error(), "at most 100Gi") {
		t.Errorf("101Gi under a 100Gi bound: %v, want refused", err)
	}
	if _, err := DatasetAttributes(&datav1alpha1.VolumeConfig{SourceType: "S3", SourceURL: "s3://b/p",
		Capacity: ptr.To(resource.MustParse("100Gi"))}, limited); err != nil {
		t.Errorf("100Gi under a 100Gi bound: %v", err)
	}
	if _, err := DatasetAttributes(&datav1alpha1.VolumeConfig{SourceType: "Local", SourceURL: "file:///srv/datasets/x"}, Config{}); err == nil ||
		!strings.Contains(err.Error(), "local sources are disabled") {
		t.Errorf("Local without roots: %v", err)
	}
}

func node(name string, labels map[string]string, taints ...corev1.Taint) corev1.Node {
	l := map[string]string{consts.TopologyKey: name}
	for k, v := range labels {
		l[k] = v
	}
	return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}, Spec: corev1.NodeSpec{Taints: taints}}
}

func TestSelectNodes(t *testing.T) {
	gpu := map[string]string{"gpu": "true"}
	taint := corev1.Taint{Key: "dedicated", Value: "ml", Effect: corev1.TaintEffectNoSchedule}
	nodes := []corev1.Node{
		node("n1", nil), node("n2", gpu), node("n3", gpu, taint), node("n4", gpu),
		{ObjectMeta: metav1.ObjectMeta{Name: "no-driver"}},
	}
	gpuAffinity := &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "gpu", Operator: "In", Values: []string{"true"}}}}}}}
	// n5 and n6 report StoragePools with room (n6 more), n5 already holds the dataset (which
	// counts for nothing: the namespace has not proved it may read that copy), n7 has too little
	// room for the capacity. This volume's order (Spread) takes n5 before n6. cp is a
	// control-plane node.
	cp := node("cp", gpu, corev1.Taint{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule})
	nodes = append(nodes, cp)
	nodes = append(nodes, node("n5", gpu), node("n6", gpu), node("n7", gpu))
	inv := map[string]*NodeInventory{
		"n5": {Free: 1 << 30, Ready: map[string]bool{"ds": true}},
		"n6": {Free: 100 << 30, Ready: map[string]bool{}},
		"n7": {Free: 1 << 20, Ready: map[string]bool{}},
	}
	tests := []struct {
		name    string
		vc      datav1alpha1.VolumeConfig
		current []string
		allowCP bool
		want    []string
	}{
		{name: "nodes with room first, never one without room", vc: datav1alpha1.VolumeConfig{Replicas: 2, NodeAffinity: gpuAffinity},
			want: []string{"n5", "n6"}},
		{name: "by the volume's order, not by the room reported", vc: datav1alpha1.VolumeConfig{Replicas: 1, NodeAffinity: gpuAffinity},
			want: []string{"n5"}},
		{name: "nodes without a StoragePool come after those with room", vc: datav1alpha1.VolumeConfig{Replicas: 4, NodeAffinity: gpuAffinity},
			want: []string{"n2", "n4", "n5", "n6"}},
		{name: "current nodes are kept over warmer ones", vc: datav1alpha1.VolumeConfig{Replicas: 2, NodeAffinity: gpuAffinity},
			current: []string{"n2", "n4"}, want: []string{"n2", "n4"}},
		{name: "never a node without the driver", vc: datav1alpha1.VolumeConfig{Replicas: 8}, want: []string{"n1", "n2", "n4", "n5", "n6"}},
		{name: "toleration admits the tainted node", vc: datav1alpha1.VolumeConfig{Replicas: 6, NodeAffinity: gpuAffinity,
			Tolerations: []corev1.Toleration{{Key: "dedicated", Operator: "Equal", Value: "ml", Effect: "NoSchedule"}}}, want: []string{"n2", "n3", "n4", "n5", "n6"}},
		{name: "current nodes are kept", vc: datav1alpha1.VolumeConfig{Replicas: 2}, current: []string{"n4", "n1"}, want: []string{"n1", "n4"}},
		{name: "a current node that is no longer eligible is replaced by one with room", vc: datav1alpha1.VolumeConfig{Replicas: 2, NodeAffinity: gpuAffinity},
			current: []string{"n1", "n4"}, want: []string{"n4", "n5"}},
		{name: "a drained node is replaced", vc: datav1alpha1.VolumeConfig{Replicas: 2, NodeAffinity: gpuAffinity},
			current: []string{"n2", "drained"}, want: []string{"n2", "n5"}},
		{name: "failure case - tolerating everything does not reach a control-plane node", vc: datav1alpha1.VolumeConfig{Replicas: 8, NodeAffinity: gpuAffinity,
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}}, want: []string{"n2", "n3", "n4", "n5", "n6"}},
		{name: "failure case - a current control-plane node is left", vc: datav1alpha1.VolumeConfig{Replicas: 1, NodeAffinity: gpuAffinity,
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}}, current: []string{"cp"}, want: []string{"n5"}},
		{name: "the administrator allows control-plane nodes", vc: datav1alpha1.VolumeConfig{Replicas: 8, NodeAffinity: gpuAffinity,
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}}, allowCP: true, want: []string{"cp", "n2", "n3", "n4", "n5", "n6"}},
	}
	drained := node("drained", gpu)
	drained.Spec.Unschedulable = true
	nodes = append(nodes, drained)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := Placement{Nodes: nodes, Inventories: inv, DatasetID: "ds", Capacity: 1 << 30, AllowControlPlane: tc.allowCP, Spread: "0123/data"}
			if d := cmp.Diff(tc.want, SelectNodes(&tc.vc, p, tc.current)); d != "" {
				t.Errorf("nodes (-want +got):\n%s", d)
			}
		})
	}
}

// TestSelectNodesSpreads: new volumes are spread over the nodes with room by an order of their
// own, not by what the nodes report. A node reporting a petabyte free (it writes its own
// StoragePools) gets its share of 200 VolumeManagers, not all of them, and a cache holding the
// dataset changes no choice.
func TestSelectNodesSpreads(t *testing.T) {
	var nodes []corev1.Node
	inv := map[string]*NodeInventory{}
	for i := range 10 {
		name := fmt.Sprintf("node-%d", i)
		nodes = append(nodes, node(name, nil))
		inv[name] = &NodeInventory{Free: int64(10+i) << 30, Ready: map[string]bool{}}
	}
	inv["node-3"].Free = 1 << 50
	cached := maps.Clone(inv)
	cached["node-7"] = &NodeInventory{Free: inv["node-7"].Free, Ready: map[string]bool{"ds": true}}
	for _, replicas := range []int32{1, 3} {
		chosen := map[string]int{}
		const volumes = 200
		for i := range volumes {
			vm := &datav1alpha1.VolumeManager{ObjectMeta: metav1.ObjectMeta{UID: types.UID(fmt.Sprintf("uid-%d", i))}}
			vc := &datav1alpha1.VolumeConfig{ID: "data", Replicas: replicas}
			p := Placement{Nodes: nodes, Inventories: inv, DatasetID: "ds", Capacity: 1 << 30, Spread: SpreadKey(vm, vc)}
			got := SelectNodes(vc, p, nil)
			p.Inventories = cached
			if other := SelectNodes(vc, p, nil); !slices.Equal(got, other) {
				t.Errorf("volume %d: %v, with the dataset cached on node-7 %v", i, got, other)
			}
			for _, n := range got {
				chosen[n]++
			}
		}
		// Fair is volumes × replicas / 10 nodes; an even spread stays well within twice that.
		fair := volumes * int(replicas) / 10
		for name := range inv {
			if chosen[name] == 0 || chosen[name] > 2*fair {
				t.Errorf("%d replicas: %s chosen for %d of %d volumes (fair share %d): %v", replicas, name, chosen[name], volumes, fair, chosen)
			}
		}
	}
}

func TestPersistentVolumeAndClaim(t *testing.T) {
	vm := &datav1alpha1.VolumeManager{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "team"}}
	vc := &datav1alpha1.VolumeConfig{ID: "imagenet", Replicas: 2, SourceType: "S3", SourceURL: "s3://b/p",
		Options: map[string]string{"secretName": "creds"}, Labels: map[string]string{"app": "train"}}
	nodes := []string{"n1", "n2"}
	pv := PersistentVolume(vm, vc, nodes, map[string]string{"source": "s3://b/p"}, Config{})
	pvc := PersistentVolumeClaim(vm, vc, nodes)
	if pv.Spec.CSI.Driver != consts.DriverName || pv.Spec.ClaimRef.Name != pvc.Name || pvc.Spec.VolumeName != pv.Name ||
		pv.Spec.ClaimRef.Namespace != "team" || !pv.Spec.CSI.ReadOnly || pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain {
		t.Errorf("PV and claim do not point at each other or are not read-only Retain: %+v / %+v", pv.Spec, pvc.Spec)
	}
	if d := cmp.Diff(&corev1.SecretReference{Name: "creds", Namespace: "team"}, pv.Spec.CSI.NodeStageSecretRef); d != "" {
		t.Errorf("secret ref: %s", d)
	}
	if d := cmp.Diff(NodeAffinity(nodes).RequiredDuringSchedulingIgnoredDuringExecution, pv.Spec.NodeAffinity.Required); d != "" {
		t.Errorf("PV node affinity: %s", d)
	}
	if pv.Labels[LabelManager] != "vm" || pv.Labels[LabelNamespace] != "team" || pv.Labels["app"] != "train" {
		t.Errorf("labels = %v", pv.Labels)
	}
	// The node charges the volume's listings to the claim's namespace (NodeStageVolume names no pod).
	if ns := pv.Spec.CSI.VolumeAttributes[consts.VolumeContextPVCNamespace]; ns != "team" {
		t.Errorf("PV names namespace %q, want the claim's", ns)
	}
	if other := PersistentVolumeClaim(vm, vc, []string{"n1", "n3"}); other.Name == pvc.Name {
		t.Error("a new node set must get a new claim name")
	}
	st := StatusVolume(vc, pvc.Name, nodes, nil, "")
	if st.VolumeSource.PersistentVolumeClaim.ClaimName != pvc.Name || !st.VolumeSource.PersistentVolumeClaim.ReadOnly {
		t.Errorf("status volume source = %+v", st.VolumeSource)
	}
	if pv.Spec.CSI.NodePublishSecretRef != nil {
		t.Errorf("a read-only volume needs no publish secret: %+v", pv.Spec.CSI.NodePublishSecretRef)
	}

	// Writable: each pod gets its own copy, filled with the credentials it brings to NodePublish.
	rw := vc.DeepCopy()
	rw.AccessMode = corev1.ReadWriteOnce
	pv = PersistentVolume(vm, rw, nodes, map[string]string{"source": "s3://b/p"}, Config{})
	if pv.Spec.CSI.ReadOnly || pv.Spec.CSI.NodePublishSecretRef == nil || pv.Spec.CSI.NodePublishSecretRef.Name != "creds" {
		t.Errorf("writable PV: %+v", pv.Spec.CSI)
	}
	if st := StatusVolume(rw, pvc.Name, nodes, nil, ""); st.VolumeSource.PersistentVolumeClaim.ReadOnly {
		t.Errorf("writable status volume source = %+v", st.VolumeSource)
	}
}

// TestStagerPod: least privilege, pinned to its node, mounting the claim read-only.
func TestStagerPod(t *testing.T) {
	vm := &datav1alpha1.VolumeManager{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "team"}}
	vc := &datav1alpha1.VolumeConfig{ID: "imagenet", Tolerations: []corev1.Toleration{{Key: "gpu", Operator: "Exists"}}}
	n := node("node-a", nil)
	n.Labels[corev1.LabelHostname] = "host-a"
	pod := StagerPod(vm, vc, "claim", &n, "node-a", "img:1")
	spec := pod.Spec
	c := spec.Containers[0]
	switch {
	case spec.RestartPolicy != corev1.RestartPolicyNever, *spec.AutomountServiceAccountToken, !*spec.SecurityContext.RunAsNonRoot,
		!*c.SecurityContext.ReadOnlyRootFilesystem, *c.SecurityContext.AllowPrivilegeEscalation, c.SecurityContext.Capabilities.Drop[0] != "ALL":
		t.Errorf("not least privilege: %+v", spec)
	case c.Image != "img:1" || c.Args[0] != "--version":
		t.Errorf("container %+v", c)
	case spec.Volumes[0].PersistentVolumeClaim.ClaimName != "claim" || !spec.Volumes[0].PersistentVolumeClaim.ReadOnly || !c.VolumeMounts[0].ReadOnly:
		t.Errorf("volume %+v", spec.Volumes)
	case spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Values[0] != "host-a":
		t.Errorf("affinity %+v", spec.Affinity)
	case len(spec.Tolerations) != 1 || pod.Labels[LabelStager] != "true" || pod.Annotations[AnnotationStagerNode] != "node-a":
		t.Errorf("tolerations/labels %+v %v %v", spec.Tolerations, pod.Labels, pod.Annotations)
	}
	if other := StagerPod(vm, vc, "claim", &n, "node-b", "img:1"); other.Name == pod.Name {
		t.Error("each node needs its own stager pod")
	}
}
