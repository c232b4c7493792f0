package workloads_test

import (
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/workloads/lws"
	"github.com/cistern-csi/cistern/test/workloads/testutil"
)

// TestLeaderWorkerSetRollout: a new worker image rolls every group onto the new revision (each
// replaced leader brings a new worker StatefulSet), and UniquePerReplica gives each group its own
// headless Service and subdomain. The update waits for each replaced group to be ready before
// the next, so the pods run on nodes with a fake kubelet.
func TestLeaderWorkerSetRollout(t *testing.T) {
	cp, ns, ctx := setupNamespace(t, "lws-roll")
	readyNodes(t, cp, ns)
	l := newLWS(ns, "roll", 2, 2, onReadyNodes(ns), func(l *v1alpha1.LeaderWorkerSet) {
		l.Spec.NetworkConfig = &v1alpha1.NetworkConfig{SubdomainPolicy: ptr.To(v1alpha1.SubdomainUniquePerReplica)}
	})
	if err := cl.Create(ctx, l); err != nil {
		t.Fatal(err)
	}
	sel := map[string]string{v1alpha1.SetNameLabelKey: "roll"}
	revisionOf := func() string {
		var cur v1alpha1.LeaderWorkerSet
		if err := cl.Get(ctx, client.ObjectKeyFromObject(l), &cur); err != nil {
			t.Fatal(err)
		}
		lws.SetDefaults(&cur)
		return lws.TemplateHash(&cur)
	}
	allAt := func(rev, image string) error {
		pods := list(t, &corev1.PodList{}, ns, sel).Items
		if len(pods) != 4 {
			return fmt.Errorf("%d pods", len(pods))
		}
		for _, p := range pods {
			if p.Labels[v1alpha1.RevisionKey] != rev || p.Spec.Containers[0].Image != image {
				return fmt.Errorf("pod %s at %s/%s", p.Name, p.Labels[v1alpha1.RevisionKey], p.Spec.Containers[0].Image)
			}
			group := "roll-" + p.Labels[v1alpha1.GroupIndexLabelKey]
			if p.Spec.Subdomain != group {
				return fmt.Errorf("pod %s subdomain %q, want %q", p.Name, p.Spec.Subdomain, group)
			}
		}
		return nil
	}
	rev1 := revisionOf()
	testutil.Eventually(t, time.Minute, "groups at the first revision", func() error { return allAt(rev1, "registry.invalid/app:1") })
	for _, g := range []string{"roll-0", "roll-1"} {
		var svc corev1.Service
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: g}, &svc); err != nil || svc.Spec.Selector[v1alpha1.GroupIndexLabelKey] == "" {
			t.Errorf("per-group Service %s: %v %+v", g, err, svc.Spec.Selector)
		}
	}

	if _, err := patchLWS(ctx, client.ObjectKeyFromObject(l), func(cur *v1alpha1.LeaderWorkerSet) {
		cur.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.Containers[0].Image = "registry.invalid/app:2"
	}); err != nil {
		t.Fatal(err)
	}
	rev2 := revisionOf()
	if rev2 == rev1 {
		t.Fatal("image change kept the revision")
	}
	testutil.Eventually(t, 2*time.Minute, "groups rolled to the new revision", func() error { return allAt(rev2, "registry.invalid/app:2") })
	testutil.Eventually(t, time.Minute, "worker StatefulSets at the new revision, status updated", func() error {
		for _, s := range list(t, &appsv1.StatefulSetList{}, ns, sel).Items {
			if s.Labels[v1alpha1.RevisionKey] != rev2 {
				return fmt.Errorf("StatefulSet %s at %s", s.Name, s.Labels[v1alpha1.RevisionKey])
			}
		}
		var cur v1alpha1.LeaderWorkerSet
		if err := cl.Get(ctx, client.ObjectKeyFromObject(l), &cur); err != nil {
			return err
		}
		if cur.Status.UpdatedReplicas != 2 {
			return fmt.Errorf("status %+v", cur.Status)
		}
		return nil
	})
}
