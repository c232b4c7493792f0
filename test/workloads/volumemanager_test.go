package workloads_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/workloads/volumemanager"
	"github.com/cistern-csi/cistern/test/framework"
)

// TestVolumeManager: a dataset wanted on two of three GPU nodes gets a static volume of the Cistern
// driver pinned to two eligible nodes and a claim the PV binder binds; the status gives the
// volumeSource and nodeAffinity; deleting the VolumeManager releases both. (That the driver then
// stages the bytes on those nodes is the driver's suite.)
func TestVolumeManager(t *testing.T) {
	cp := setup(t)
	ns := framework.CreateNamespace(t, cp, "vm")
	ctx := ctxT(t)
	// The taint keeps LeaderWorkerSet pods of other tests off these nodes.
	vmTaint := corev1.Taint{Key: "test.cistern.dev/vm", Effect: corev1.TaintEffectNoSchedule}
	var gpuNodes []string
	for i := range 3 {
		n := fmt.Sprintf("%s-gpu-%d", ns, i)
		framework.CreateNode(t, cp, n, map[string]string{"test.cistern.dev/gpu": "true"}, vmTaint)
		gpuNodes = append(gpuNodes, n)
	}
	framework.CreateNode(t, cp, ns+"-cpu", nil, vmTaint)

	vm := &datav1alpha1.VolumeManager{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "data"},
		Spec: datav1alpha1.VolumeManagerSpec{VolumeConfigs: []datav1alpha1.VolumeConfig{
			{
				ID: "imagenet", Replicas: 2, SourceType: datav1alpha1.SourceS3, SourceURL: "s3://datasets/imagenet",
				Options: map[string]string{"endpoint": "http://127.0.0.1:7070", "pathStyle": "true", "secretName": "s3-creds"},
				NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
					NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
						Key: "test.cistern.dev/gpu", Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}}}}}}},
				Tolerations: []corev1.Toleration{{Key: "test.cistern.dev/vm", Operator: corev1.TolerationOpExists}},
			},
			{ID: "escape", Replicas: 1, SourceType: datav1alpha1.SourceLocal, SourceURL: "file:///etc"},
		}},
	}
	if err := cl.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	var got datav1alpha1.VolumeManager
	eventually(t, time.Minute, "imagenet bound on two GPU nodes; escape refused", func() error {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(vm), &got); err != nil {
			return err
		}
		if len(got.Status.Volumes) != 2 {
			return fmt.Errorf("status %+v", got.Status)
		}
		v := got.Status.Volumes[0]
		if v.Message != "" || len(v.Nodes) != 2 || v.VolumeSource.PersistentVolumeClaim == nil {
			return fmt.Errorf("imagenet: %+v", v)
		}
		return nil
	})
	v, esc := got.Status.Volumes[0], got.Status.Volumes[1]
	for _, n := range v.Nodes {
		if !slices.Contains(gpuNodes, n) {
			t.Errorf("data placed on %s, not a GPU node", n)
		}
	}
	if got.Status.State != datav1alpha1.StateFailed || !strings.Contains(esc.Message, `path "/etc" is not under an allowed root`) {
		t.Errorf("Local source outside the roots: state %s, %+v", got.Status.State, esc)
	}
	if terms := v.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms; len(terms) != 1 ||
		terms[0].MatchExpressions[0].Key != consts.TopologyKey || !slices.Equal(terms[0].MatchExpressions[0].Values, v.Nodes) {
		t.Errorf("nodeAffinity %+v", v.NodeAffinity)
	}

	var pv corev1.PersistentVolume
	eventually(t, time.Minute, "one PV", func() error {
		var pvs corev1.PersistentVolumeList
		if err := cl.List(ctx, &pvs, client.MatchingLabels{volumemanager.LabelManager: "data", volumemanager.LabelNamespace: ns}); err != nil {
			return err
		}
		if len(pvs.Items) != 1 {
			return fmt.Errorf("%d PVs", len(pvs.Items))
		}
		pv = pvs.Items[0]
		return nil
	})
	if pv.Spec.CSI.Driver != consts.DriverName || pv.Spec.CSI.VolumeAttributes[consts.ParamSource] != "s3://datasets/imagenet" ||
		pv.Spec.CSI.VolumeAttributes[consts.ParamEndpoint] != "http://127.0.0.1:7070" || pv.Spec.CSI.VolumeAttributes[consts.ParamPathStyle] != "true" ||
		pv.Spec.CSI.NodeStageSecretRef == nil || pv.Spec.CSI.NodeStageSecretRef.Name != "s3-creds" || pv.Spec.CSI.NodeStageSecretRef.Namespace != ns {
		t.Errorf("PV CSI source %+v", pv.Spec.CSI)
	}

	if err := cl.Delete(ctx, vm); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "VolumeManager, claim and PV released", func() error {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(vm), &got); err == nil {
			return fmt.Errorf("VolumeManager still there (finalizers %v)", got.Finalizers)
		}
		if err := cl.Get(ctx, client.ObjectKey{Name: pv.Name}, &pv); err == nil {
			return fmt.Errorf("PV %s still there", pv.Name)
		}
		var pvcs corev1.PersistentVolumeClaimList
		if err := cl.List(ctx, &pvcs, client.InNamespace(ns)); err != nil || len(pvcs.Items) > 0 {
			return fmt.Errorf("claims left: %v %d", err, len(pvcs.Items))
		}
		return nil
	})
}
