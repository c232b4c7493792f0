package driver

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/outputevents"
	"github.com/cistern-csi/cistern/pkg/volume"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// TestStagingEvents stages S3 datasets slowed down by the proxy (each object GET delayed, two at
// a time) with the node plugin recording as its ServiceAccount, with deploy/csi's
// cistern-node-output-events grant, on a real API server, and finds the Events as kubectl
// describe does (kind, name, UID).
func TestStagingEvents(t *testing.T) {
	cp := framework.StartControlPlane(t, framework.Options{})
	rec := outputevents.New(nodeEventsClient(t, cp), "node-1", "cistern-csi-driver")
	t.Cleanup(rec.Stop)
	env := startDriver(t, testPool{name: "fast"})
	env.stop()
	env.cfg.Staging = volume.StagingEvents{OnEvent: rec.Record, Interval: time.Second}
	env.cfg.Datasets.Concurrency = 2
	env.start()
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "slow")
	for _, set := range []string{"set", "inline"} {
		for i := range 8 {
			s.Put(t, "slow", fmt.Sprintf("%s/f%d", set, i), bytes.Repeat([]byte{byte('a' + i)}, 1<<20))
		}
	}
	// 8 GETs of 750 ms, two at a time: a staging takes at least 3 s, more than three intervals.
	proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/slow/") && len(r.URL.Path) > len("/slow/") {
			return testpeers.Fault{Delay: 750 * time.Millisecond, ResetAfter: -1, Name: "slow"}
		}
		return testpeers.None
	})
	secrets := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	t.Run("claim", func(t *testing.T) { stagingEventsOnClaim(t, cp, env, proxy, secrets) })
	t.Run("inline volume on its pod", func(t *testing.T) { stagingEventsOnPod(t, cp, env, proxy, secrets) })
}

// stagingEventsOnClaim: a volume created with its claim's name and namespace among its
// parameters, as external-provisioner passes them (--extra-create-metadata), and staged as
// kubelet does (retried while NodeStageVolume answers Unavailable): the claim gets Normal
// DatasetStaging Events with the progress in percent, and DatasetStaged; a claim of another
// namespace that the stage's volume context names gets none.
func stagingEventsOnClaim(t *testing.T, cp *framework.ControlPlane, env *testEnv, proxy *testpeers.Proxy, secrets map[string]string) {
	ctx := context.Background()
	ns, other := framework.CreateNamespace(t, cp, "team"), framework.CreateNamespace(t, cp, "other")
	claim, victim := newClaim(t, cp, ns, "data"), newClaim(t, cp, other, "theirs")
	before := proxy.Delivered("slow")
	vol := env.create("pvc-data", 64<<20, map[string]string{"source": "s3://slow/set/", "endpoint": proxy.URL, "pathStyle": "true",
		consts.ParamPVCName: claim.Name, consts.ParamPVCNamespace: ns, consts.ParamPVName: "pvc-data"})
	// A stage's volume context is the PV's, which its author writes: it names no Events' object.
	vc := map[string]string{consts.ParamPVCName: victim.Name, consts.ParamPVCNamespace: other}
	for k, v := range vol.VolumeContext {
		if k != consts.ParamPVCName && k != consts.ParamPVCNamespace {
			vc[k] = v
		}
	}
	staging := filepath.Join(env.dir, "staging", vol.VolumeId)
	attempts := 0
	err := retryUnavailable(t, func() error {
		attempts++
		// The driver answers 3 s before the deadline (budget): each attempt waits about 1 s.
		actx, cancel := context.WithTimeout(ctx, 4*time.Second)
		defer cancel()
		_, err := env.node.NodeStageVolume(actx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging,
			VolumeCapability: mountCap(""), VolumeContext: vc, Secrets: secrets})
		return err
	})
	if err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	t.Cleanup(func() {
		_, _ = env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging})
	})
	if n := proxy.Delivered("slow") - before; n < 8 {
		t.Errorf("%d object GETs delayed, want at least 8", n)
	}
	ref := eventRef{kind: "PersistentVolumeClaim", obj: claim}
	staged := waitEvent(t, cp, ref, volume.ReasonDatasetStaged, "Dataset s3://slow/set/ is staged on the node: 8.0 MiB in")
	progress := wantProgress(t, cp, ref, "s3://slow/set/")
	t.Logf("%d attempts; DatasetStaging: %q; DatasetStaged: %q", attempts, progress, staged.Message)
	// Events are sent in order: the other namespace's claim had its chance before DatasetStaged.
	if evs := objectEvents(t, cp, eventRef{kind: "PersistentVolumeClaim", obj: victim}); len(evs) != 0 {
		t.Errorf("Events on claim %s/%s, which only the stage's volume context named: %+v", other, victim.Name, evs)
	}
}

// stagingEventsOnPod: a read-only inline volume, published (and retried) with the pod info
// kubelet adds (podInfoOnMount), gets its Events on that pod.
func stagingEventsOnPod(t *testing.T, cp *framework.ControlPlane, env *testEnv, proxy *testpeers.Proxy, secrets map[string]string) {
	ctx := context.Background()
	ns := framework.CreateNamespace(t, cp, "team")
	// No controller-manager makes the namespace's default ServiceAccount, which pod admission
	// looks up.
	if _, err := cp.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := cp.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "reader"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://slow/inline/", "endpoint": proxy.URL, "pathStyle": "true",
		consts.VolumeContextPodName: pod.Name, consts.VolumeContextPodNamespace: ns, consts.VolumeContextPodUID: string(pod.UID)}
	target := filepath.Join(env.dir, "target", "inline-reader")
	if err := retryUnavailable(t, func() error {
		actx, cancel := context.WithTimeout(ctx, 4*time.Second)
		defer cancel()
		_, err := env.node.NodePublishVolume(actx, &csi.NodePublishVolumeRequest{VolumeId: "inline-reader", TargetPath: target,
			VolumeCapability: mountCap(""), VolumeContext: vc, Readonly: true, Secrets: secrets})
		return err
	}); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
	t.Cleanup(func() {
		_, _ = env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "inline-reader", TargetPath: target})
	})
	ref := eventRef{kind: "Pod", obj: pod}
	waitEvent(t, cp, ref, volume.ReasonDatasetStaged, "Dataset s3://slow/inline/ is staged on the node: 8.0 MiB in")
	wantProgress(t, cp, ref, "s3://slow/inline/")
}

// wantProgress returns the messages of the DatasetStaging Events about ref, and fails unless
// each is Normal and one tells the progress of dataset in percent.
func wantProgress(t *testing.T, cp *framework.ControlPlane, ref eventRef, dataset string) []string {
	t.Helper()
	var progress []string
	percent := false
	for _, e := range objectEvents(t, cp, ref) {
		if e.Reason != volume.ReasonDatasetStaging {
			continue
		}
		if e.Type != corev1.EventTypeNormal {
			t.Errorf("%s Event of type %s", e.Reason, e.Type)
		}
		progress = append(progress, e.Message)
		percent = percent || strings.HasPrefix(e.Message, "Staging dataset "+dataset+": ") && strings.Contains(e.Message, " of 8.0 MiB, ") && strings.Contains(e.Message, "%")
	}
	if !percent {
		t.Errorf("no DatasetStaging Event with the progress in percent on %s %s/%s; DatasetStaging: %q", ref.kind, ref.obj.GetNamespace(), ref.obj.GetName(), progress)
	}
	return progress
}

// eventRef is an object Events are about.
type eventRef struct {
	kind string
	obj  metav1.Object
}

// newClaim creates a claim name in ns.
func newClaim(t *testing.T, cp *framework.ControlPlane, ns, name string) *corev1.PersistentVolumeClaim {
	t.Helper()
	pvc, err := cp.Client.CoreV1().PersistentVolumeClaims(ns).Create(context.Background(), &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pvc
}

// objectEvents lists the Events about ref as kubectl describe selects them.
func objectEvents(t *testing.T, cp *framework.ControlPlane, ref eventRef) []corev1.Event {
	t.Helper()
	sel := "involvedObject.kind=" + ref.kind + ",involvedObject.name=" + ref.obj.GetName() + ",involvedObject.uid=" + string(ref.obj.GetUID())
	evs, err := cp.Client.CoreV1().Events(ref.obj.GetNamespace()).List(context.Background(), metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	return evs.Items
}

// waitEvent waits for a Normal Event of reason about ref, from the node plugin, whose message
// starts with prefix.
func waitEvent(t *testing.T, cp *framework.ControlPlane, ref eventRef, reason, prefix string) corev1.Event {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute) // the broadcaster sends asynchronously; the machine may be busy
	for {
		evs := objectEvents(t, cp, ref)
		for _, e := range evs {
			if e.Reason == reason && e.Type == corev1.EventTypeNormal && strings.HasPrefix(e.Message, prefix) &&
				e.Source.Component == "cistern-csi-driver" && e.Source.Host == "node-1" {
				return e
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s Event %q… on %s %s/%s; Events: %+v", reason, prefix, ref.kind, ref.obj.GetNamespace(), ref.obj.GetName(), evs)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// nodeEventsClient is a client as the node plugin's ServiceAccount holding only the ClusterRole
// cistern-node-output-events of deploy/csi/driver/rbac.yaml (pkg/outputevents checks it
// grants no more than it says).
func nodeEventsClient(t *testing.T, cp *framework.ControlPlane) kubernetes.Interface {
	t.Helper()
	framework.GrantNodeRole(t, cp, "cistern-node-output-events")
	client, err := kubernetes.NewForConfig(framework.ServiceAccountConfig(t, cp, "cistern-system", "cistern-node"))
	if err != nil {
		t.Fatal(err)
	}
	return client
}
