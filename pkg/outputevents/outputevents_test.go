package outputevents_test

import (
	"context"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cistern-csi/cistern/pkg/outputevents"
	"github.com/cistern-csi/cistern/pkg/volume"
	"github.com/cistern-csi/cistern/test/framework"
)

// TestOutputEvents records write-back Events about a pod (named with its UID, as kubelet passes
// it) and a claim (named without: the recorder reads its UID; a finished upload, then an expired
// one) on a real API server, as the node
// plugin's ServiceAccount with deploy/csi's grant, and finds each the way kubectl describe does:
// by the object's kind, namespace, name and UID.
func TestOutputEvents(t *testing.T) {
	cp := framework.StartControlPlane(t, framework.Options{})
	ctx := context.Background()
	const ns = "team"
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// No controller-manager runs to make the namespace's default ServiceAccount, which pod
	// admission looks up.
	if _, err := cp.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := cp.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "train-0"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvc, err := cp.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "work"},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The node plugin records as its ServiceAccount, with only deploy/csi's grant for these Events.
	r := outputevents.New(nodeClient(t, cp), "node-a", "cistern-csi-driver")
	t.Cleanup(r.Stop)
	r.Record(volume.Event{Object: volume.ObjectRef{Kind: "Pod", Namespace: ns, Name: pod.Name, UID: string(pod.UID)},
		Warning: true, Reason: volume.ReasonOutputUploadFailed, Message: "Upload of volume v1's outputs to s3://out/ failed (attempt 2): AccessDenied; retrying in 4s, the data is kept"})
	r.Record(volume.Event{Object: volume.ObjectRef{Kind: "PersistentVolumeClaim", Namespace: ns, Name: pvc.Name},
		Reason: volume.ReasonOutputUploadFinished, Message: "Outputs of volume v2 are at s3://out/claim/: 2 objects, 6291464 bytes"})

	find(t, cp, "Pod", pod, corev1.EventTypeWarning, volume.ReasonOutputUploadFailed, "AccessDenied")
	find(t, cp, "PersistentVolumeClaim", pvc, corev1.EventTypeNormal, volume.ReasonOutputUploadFinished, "2 objects")
	// An upload that expired (--writeback-max-age) is a Warning on its claim.
	r.Record(volume.Event{Object: volume.ObjectRef{Kind: "PersistentVolumeClaim", Namespace: ns, Name: pvc.Name}, Warning: true,
		Reason: volume.ReasonOutputUploadExpired, Message: "Upload of volume v2's outputs to s3://out/claim/ expired, pending longer than node node-a allows"})
	find(t, cp, "PersistentVolumeClaim", pvc, corev1.EventTypeWarning, volume.ReasonOutputUploadExpired, "expired")
}

// find waits for an Event about an object, selected as kubectl describe selects them.
func find(t *testing.T, cp *framework.ControlPlane, kind string, obj metav1.Object, typ, reason, text string) {
	t.Helper()
	sel := "involvedObject.kind=" + kind + ",involvedObject.name=" + obj.GetName() + ",involvedObject.uid=" + string(obj.GetUID())
	deadline := time.Now().Add(2 * time.Minute) // the broadcaster sends asynchronously; the machine may be busy
	for {
		evs, err := cp.Client.CoreV1().Events(obj.GetNamespace()).List(context.Background(), metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Items {
			if e.Reason == reason && e.Type == typ && strings.Contains(e.Message, text) && e.Source.Component == "cistern-csi-driver" && e.Source.Host == "node-a" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s Event %q on %s %s/%s; events: %+v", reason, text, kind, obj.GetNamespace(), obj.GetName(), evs.Items)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// nodeClient is a client as the node plugin's ServiceAccount holding only the ClusterRole
// cistern-node-output-events of deploy/csi/driver/rbac.yaml, which it checks grants no more
// than it says.
func nodeClient(t *testing.T, cp *framework.ControlPlane) kubernetes.Interface {
	t.Helper()
	framework.GrantNodeRole(t, cp, "cistern-node-output-events")
	for _, tc := range []struct {
		verb, resource string
		want           bool
	}{{"create", "events", true}, {"patch", "events", true}, {"get", "persistentvolumeclaims", true},
		{"list", "events", false}, {"get", "pods", false}, {"list", "persistentvolumeclaims", false}, {"get", "secrets", false}} {
		if got := framework.ServiceAccountMay(t, cp, "cistern-system", "cistern-node", authorizationv1.ResourceAttributes{
			Verb: tc.verb, Resource: tc.resource, Namespace: "team"}); got != tc.want {
			t.Errorf("cistern-node may %s %s: %v, want %v", tc.verb, tc.resource, got, tc.want)
		}
	}
	client, err := kubernetes.NewForConfig(framework.ServiceAccountConfig(t, cp, "cistern-system", "cistern-node"))
	if err != nil {
		t.Fatal(err)
	}
	return client
}
