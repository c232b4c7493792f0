package workloads_test

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/workloads/volumemanager"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/workloads/testutil"
)

// publishOutputs plays the node's storagepool-sidecar reporting the outputs its node holds.
func publishOutputs(t *testing.T, node string, total int32, outs ...spapi.VolumeOutputs) {
	t.Helper()
	ctx := testutil.Context(t)
	var sp spapi.StoragePool
	if err := cl.Get(ctx, client.ObjectKey{Name: "fast." + node}, &sp); err != nil {
		t.Fatal(err)
	}
	sp.Status.Cache.Outputs, sp.Status.Cache.OutputsTotal = outs, total
	if err := cl.Status().Update(ctx, &sp); err != nil {
		t.Fatal(err)
	}
}

// TestVolumeManagerOutputs: a VolumeManager with an outputTarget gives it to its PersistentVolume
// and turns Completed only once its node reports no copy's outputs left: with spec.state
// Completed and no pod left, the claim goes but the volume stays while the node lists a copy in
// use, then uploading; a failing upload makes it Failed (not final) with a Warning Event; an
// unlisted report keeps it waiting; once the node lists nothing the volume goes and the state is
// Completed, OutputsUploaded True. Each step awaited with kubectl wait.
func TestVolumeManagerOutputs(t *testing.T) {
	cp := setup(t)
	ns := framework.CreateNamespace(t, cp, "vmout")
	ctx := testutil.Context(t)
	node, vc := nodeOfOwn(t, cp, ns, "ckpt")
	vc.AccessMode = corev1.ReadWriteOnce
	vc.OutputTarget = "s3://results/${pod.namespace}/${pod.name}"
	vc.OutputInterval = &metav1.Duration{Duration: 10 * time.Minute}

	// The API server refuses an output target on read-only copies, and output fields without one.
	bad := vc
	bad.AccessMode = ""
	for _, c := range []struct {
		vc   datav1alpha1.VolumeConfig
		want string
	}{{bad, "outputTarget needs a writer accessMode"}, {datav1alpha1.VolumeConfig{ID: "x", Replicas: 1, SourceType: "S3",
		SourceURL: "s3://b/p", OutputDeletions: true}, "outputInterval and outputDeletions need outputTarget"}} {
		err := cl.Create(ctx, &datav1alpha1.VolumeManager{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad"},
			Spec: datav1alpha1.VolumeManagerSpec{VolumeConfigs: []datav1alpha1.VolumeConfig{c.vc}}})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("create: %v, want %q", err, c.want)
		}
	}

	vm := &datav1alpha1.VolumeManager{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "out"},
		Spec: datav1alpha1.VolumeManagerSpec{VolumeConfigs: []datav1alpha1.VolumeConfig{vc}}}
	if err := cl.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	publishInventory(t, node, datasetID(t, &vc), spapi.DatasetReady, "")
	stagerRan(t, ns, node)
	kubectlWait(t, cp, ns, "out", "jsonpath={.status.state}=Running")
	// No copy yet: nothing held.
	kubectlWait(t, cp, ns, "out", "condition=OutputsUploaded")

	var pvs corev1.PersistentVolumeList
	if err := cl.List(ctx, &pvs, client.MatchingLabels{volumemanager.LabelManager: "out", volumemanager.LabelNamespace: ns}); err != nil || len(pvs.Items) != 1 {
		t.Fatalf("PVs: %v %d", err, len(pvs.Items))
	}
	pv := pvs.Items[0]
	attrs := pv.Spec.CSI.VolumeAttributes
	if attrs[consts.ParamOutputTarget] != vc.OutputTarget || attrs[consts.ParamOutputInterval] != "10m0s" || attrs[consts.ParamOutputDeletions] != "" {
		t.Fatalf("PV attributes: %v", attrs)
	}
	handle := pv.Spec.CSI.VolumeHandle

	// A pod's copy in use on the node.
	publishOutputs(t, node, 1, spapi.VolumeOutputs{Volume: handle, InUse: 1})
	kubectlWait(t, cp, ns, "out", `jsonpath={.status.conditions[?(@.type=="OutputsUploaded")].reason}=InUse`)

	// Completed asked; no pod uses the claim any more (the copy not yet unpublished): the claim
	// goes, the volume stays.
	patch := exec.Command(framework.Binary(t, "kubectl"), "--kubeconfig", cp.Kubeconfig, "-n", ns, "patch", "volumemanager/out",
		"--type=merge", "-p", `{"spec":{"state":"Completed"}}`)
	if out, err := patch.CombinedOutput(); err != nil {
		t.Fatalf("kubectl patch spec.state Completed: %v\n%s", err, out)
	}
	kubectlWait(t, cp, ns, "out", `jsonpath={.status.conditions[?(@.type=="Completed")].reason}=InUse`)
	held := func(state datav1alpha1.State, reason, msg string) {
		t.Helper()
		var got datav1alpha1.VolumeManager
		testutil.Eventually(t, time.Minute, "held by outputs: "+reason, func() error {
			if err := cl.Get(ctx, client.ObjectKeyFromObject(vm), &got); err != nil {
				return err
			}
			c := meta.FindStatusCondition(got.Status.Conditions, datav1alpha1.ConditionCompleted)
			o := meta.FindStatusCondition(got.Status.Conditions, datav1alpha1.ConditionOutputsUploaded)
			if got.Status.State != state || c == nil || c.Reason != reason || c.Status != metav1.ConditionFalse ||
				o == nil || o.Reason != reason || !strings.Contains(got.Status.Message, msg) {
				return fmt.Errorf("%s: %s (%+v)", got.Status.State, got.Status.Message, c)
			}
			var cur corev1.PersistentVolume
			if err := cl.Get(ctx, client.ObjectKey{Name: pv.Name}, &cur); err != nil || cur.DeletionTimestamp != nil {
				return fmt.Errorf("volume released while its outputs are held: %v", err)
			}
			var claims corev1.PersistentVolumeClaimList
			if err := cl.List(ctx, &claims, client.InNamespace(ns)); err != nil || len(claims.Items) != 0 {
				return fmt.Errorf("claims left: %v %d", err, len(claims.Items))
			}
			return nil
		})
	}
	held(datav1alpha1.StateRunning, datav1alpha1.ReasonOutputsInUse, "1 copies in use")

	// The pod let it go: uploading, 5 MiB left.
	publishOutputs(t, node, 1, spapi.VolumeOutputs{Volume: handle, Uploading: 1, BytesPending: 5 << 20})
	held(datav1alpha1.StateRunning, datav1alpha1.ReasonUploading, "1 copies uploading (5.0 MiB left)")

	// The target refuses: Failed (not final), the data kept.
	publishOutputs(t, node, 1, spapi.VolumeOutputs{Volume: handle, Uploading: 1, Failing: 1, BytesPending: 5 << 20})
	kubectlWait(t, cp, ns, "out", "jsonpath={.status.state}=Failed")
	held(datav1alpha1.StateFailed, datav1alpha1.ReasonUploadFailing, "1 failing: the target refused")

	// Retried and going again: no longer Failed.
	publishOutputs(t, node, 1, spapi.VolumeOutputs{Volume: handle, Uploading: 1, BytesPending: 1 << 20})
	held(datav1alpha1.StateRunning, datav1alpha1.ReasonUploading, "1 copies uploading (1.0 MiB left)")

	// The node lists fewer volumes with outputs than it holds: it cannot tell, so the wait goes on.
	publishOutputs(t, node, 3)
	held(datav1alpha1.StateRunning, datav1alpha1.ReasonOutputsUnknown, "no report of its outputs from "+node)

	// Every copy uploaded: the volume goes, Completed.
	publishOutputs(t, node, 0)
	kubectlWait(t, cp, ns, "out", "jsonpath={.status.state}=Completed")
	kubectlWait(t, cp, ns, "out", "condition=OutputsUploaded")
	kubectlWait(t, cp, ns, "out", "condition=Completed")
	testutil.Eventually(t, time.Minute, "volume released", func() error {
		var cur corev1.PersistentVolume
		if err := cl.Get(ctx, client.ObjectKey{Name: pv.Name}, &cur); err == nil {
			return fmt.Errorf("volume %s still there", pv.Name)
		}
		return nil
	})
	testutil.Eventually(t, time.Minute, "Events of the uploads", func() error {
		var evs corev1.EventList
		if err := cl.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		seen := map[string]string{}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "out" {
				seen[e.Reason+"/"+e.Action] = e.Type
			}
		}
		for want, typ := range map[string]string{"InUse/OutputsUploaded": "Normal", "Uploading/Completed": "Normal",
			"UploadFailing/Completed": "Warning", "UploadFailing/OutputsUploaded": "Warning", "Uploaded/OutputsUploaded": "Normal",
			"Released/Completed": "Normal"} {
			if seen[want] != typ {
				return fmt.Errorf("no %s %s Event among %v", typ, want, seen)
			}
		}
		return nil
	})
	if err := cl.Delete(ctx, vm); err != nil {
		t.Fatal(err)
	}
}
