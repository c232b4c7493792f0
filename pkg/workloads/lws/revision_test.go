package lws

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

func TestRevisionRoundTrip(t *testing.T) {
	old := testLWS(func(l *v1alpha1.LeaderWorkerSet) { l.UID = "lws-uid" })
	key := TemplateHash(old)
	rev, err := NewRevision(old, lwsKind, key, 3)
	if err != nil {
		t.Fatal(err)
	}
	if want := "lws-" + key + "-3"; rev.Name != want || rev.Namespace != "ns" || rev.Revision != 3 {
		t.Errorf("revision %s/%s number %d, want ns/%s number 3", rev.Namespace, rev.Name, rev.Revision, want)
	}
	if rev.Labels[v1alpha1.SetNameLabelKey] != "lws" || rev.Labels[v1alpha1.RevisionKey] != key {
		t.Errorf("labels %v", rev.Labels)
	}
	if ref := rev.OwnerReferences; len(ref) != 1 || ref[0].UID != "lws-uid" || ref[0].Kind != "LeaderWorkerSet" || !ptr.Deref(ref[0].Controller, false) {
		t.Errorf("owner references %+v", ref)
	}

	// The LeaderWorkerSet moved on: new image, new size, other replicas. The revision gives back
	// the old template (and so the old hash), and keeps everything else of the current object.
	cur := old.DeepCopy()
	cur.Spec.Replicas = ptr.To[int32](5)
	cur.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.Containers[0].Image = "new"
	cur.Spec.LeaderWorkerTemplate.Size = ptr.To[int32](4)
	got, err := ApplyRevision(cur, rev)
	if err != nil {
		t.Fatal(err)
	}
	if TemplateHash(got) != key {
		t.Errorf("restored template hash %s, want %s", TemplateHash(got), key)
	}
	if *got.Spec.Replicas != 5 || got.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.Containers[0].Image != "busybox" || *got.Spec.LeaderWorkerTemplate.Size != 3 {
		t.Errorf("restored spec %+v", got.Spec)
	}
	if cur.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.Containers[0].Image != "new" {
		t.Error("ApplyRevision changed its input")
	}
}

// ensureRevision numbers revisions, reuses one whose key comes back, and truncateRevisions keeps
// only the current key's.
func TestEnsureAndTruncateRevisions(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	lws := testLWS(func(l *v1alpha1.LeaderWorkerSet) { l.UID = "lws-uid" })
	names := func() map[string]bool {
		var list appsv1.ControllerRevisionList
		if err := c.List(ctx, &list, client.InNamespace("ns")); err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, r := range list.Items {
			out[r.Name] = true
		}
		return out
	}

	k1 := TemplateHash(lws)
	for range 2 {
		if err := ensureRevision(ctx, c, lws, k1); err != nil {
			t.Fatal(err)
		}
	}
	v2 := lws.DeepCopy()
	v2.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.Containers[0].Image = "v2"
	k2 := TemplateHash(v2)
	if err := ensureRevision(ctx, c, v2, k2); err != nil {
		t.Fatal(err)
	}
	// A rollback to the first template reuses its revision.
	if err := ensureRevision(ctx, c, lws, k1); err != nil {
		t.Fatal(err)
	}
	if got := names(); len(got) != 2 || !got["lws-"+k1+"-1"] || !got["lws-"+k2+"-2"] {
		t.Fatalf("revisions %v", got)
	}
	g, err := groupTemplate(ctx, c, v2, k1)
	if err != nil || g == nil || g.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.Containers[0].Image != "busybox" {
		t.Fatalf("groupTemplate of the old revision = %+v, %v", g, err)
	}
	if g, err := groupTemplate(ctx, c, v2, "unknown"); g != nil || err != nil {
		t.Fatalf("groupTemplate of an unknown revision = %+v, %v", g, err)
	}

	if err := truncateRevisions(ctx, c, v2, k2); err != nil {
		t.Fatal(err)
	}
	if got := names(); len(got) != 1 || !got["lws-"+k2+"-2"] {
		t.Fatalf("after truncation: %v", got)
	}
	// The first template again, after its revision was deleted: a new number.
	if err := ensureRevision(ctx, c, lws, k1); err != nil {
		t.Fatal(err)
	}
	if got := names(); !got["lws-"+k1+"-3"] {
		t.Fatalf("recreated revision: %v", got)
	}
}
