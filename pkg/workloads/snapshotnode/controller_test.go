package snapshotnode

import (
	"context"
	"strings"
	"testing"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/ids"
)

func content(name, driver string, source snapv1.VolumeSnapshotContentSource, labels map[string]string) *snapv1.VolumeSnapshotContent {
	return &snapv1.VolumeSnapshotContent{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: snapv1.VolumeSnapshotContentSpec{
			Driver: driver, Source: source, DeletionPolicy: snapv1.VolumeSnapshotContentRetain,
			VolumeSnapshotRef: corev1.ObjectReference{Namespace: "team", Name: "snap-" + name},
		},
	}
}

func handle(id string) snapv1.VolumeSnapshotContentSource {
	return snapv1.VolumeSnapshotContentSource{SnapshotHandle: ptr.To(id)}
}

func TestReconcile(t *testing.T) {
	onB := ids.NewSnapshotID("fast", "node-b")
	for _, tc := range []struct {
		name      string
		content   *snapv1.VolumeSnapshotContent
		wantLabel string // "" = no label
		wantEvent string // prefix of the recorded event, "" = none
	}{
		{"hand-made content of the driver: labelled with its snapshot's node",
			content("c", consts.DriverName, handle(onB), nil), "node-b", ""},
		{"its other labels are kept",
			content("c", consts.DriverName, handle(onB), map[string]string{"team": "ml"}), "node-b", ""},
		{"already labelled: left alone, even with another node",
			content("c", consts.DriverName, handle(onB), map[string]string{consts.LabelSnapshotManagedBy: "node-a"}), "node-a", ""},
		{"another driver's content: left alone",
			content("c", "other.csi.dev", handle(onB), nil), "", ""},
		{"a content the snapshot-controller makes for a volume: left to it",
			content("c", consts.DriverName, snapv1.VolumeSnapshotContentSource{VolumeHandle: ptr.To("fast-0123")}, nil), "", ""},
		{"failure case - handle that names no node: a Warning Event, no label",
			content("c", consts.DriverName, handle("fast-snap-0123456789abcdef0123456789abcdef"), nil), "",
			"Warning " + ReasonNoNode + ` snapshot handle "fast-snap-0123456789abcdef0123456789abcdef" names no node`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(scheme(t)).WithObjects(tc.content).Build()
			rec := events.NewFakeRecorder(10)
			r := &Reconciler{Client: c, Recorder: rec, DriverName: consts.DriverName}
			for range 2 { // a second pass changes nothing
				if _, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: "c"}}); err != nil {
					t.Fatalf("Reconcile: %v", err)
				}
			}
			var got snapv1.VolumeSnapshotContent
			if err := c.Get(context.Background(), types.NamespacedName{Name: "c"}, &got); err != nil {
				t.Fatal(err)
			}
			if l := got.Labels[consts.LabelSnapshotManagedBy]; l != tc.wantLabel {
				t.Errorf("label %q, want %q", l, tc.wantLabel)
			}
			for k, v := range tc.content.Labels {
				if k != consts.LabelSnapshotManagedBy && got.Labels[k] != v {
					t.Errorf("label %s=%q lost: %v", k, v, got.Labels)
				}
			}
			select {
			case e := <-rec.Events:
				if tc.wantEvent == "" || !strings.HasPrefix(e, tc.wantEvent) {
					t.Errorf("event %q, want %q", e, tc.wantEvent)
				}
				if !strings.Contains(e, consts.LabelSnapshotManagedBy+"=") {
					t.Errorf("event %q does not say which label to set", e)
				}
			default:
				if tc.wantEvent != "" {
					t.Errorf("no event, want %q", tc.wantEvent)
				}
			}
		})
	}
}

func TestReconcileGone(t *testing.T) {
	r := &Reconciler{Client: fake.NewClientBuilder().WithScheme(scheme(t)).Build(), DriverName: consts.DriverName}
	if _, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: "gone"}}); err != nil {
		t.Errorf("Reconcile of a content gone (or labelled, out of the cache): %v", err)
	}
}

func TestCacheByObjectSelectsUnlabelled(t *testing.T) {
	for obj, by := range CacheByObject() {
		if _, ok := obj.(*snapv1.VolumeSnapshotContent); !ok {
			t.Errorf("cache option for %T", obj)
		}
		if got := by.Label.String(); got != "!"+consts.LabelSnapshotManagedBy {
			t.Errorf("selector %q", got)
		}
	}
}

func scheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := snapv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}
