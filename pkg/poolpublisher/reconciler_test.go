package poolpublisher

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2/ktesting"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	spv1 "github.com/cistern-csi/cistern/pkg/rpc/storagepool/v1alpha1"
)

type env struct {
	driver *fakeDriver
	api    *fakeAPI
	ctx    context.Context
}

func newEnv(t *testing.T) *env {
	_, ctx := ktesting.NewTestContext(t)
	return &env{driver: &fakeDriver{}, api: newFakeAPI(t), ctx: ctx}
}

func (e *env) reconciler(t *testing.T, node string) *Reconciler {
	t.Helper()
	r, err := NewReconciler(Config{DriverName: consts.DriverName, NodeName: node, ResyncPeriod: time.Hour},
		startFakeDriver(t, e.driver, 1), e.api, e.api, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (e *env) sync(t *testing.T, r *Reconciler) []string {
	t.Helper()
	if err := r.Sync(e.ctx); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	return e.api.takeWrites()
}

func healthy(obj *spapi.StoragePool) metav1.Condition {
	for _, c := range obj.Status.Conditions {
		if c.Type == spapi.ConditionHealthy {
			return c
		}
	}
	return metav1.Condition{}
}

func TestSyncPublishesOnlyChanges(t *testing.T) {
	e := newEnv(t)
	e.driver.set(localPool("fast", "node-1", 100*gi, 60*gi), localPool("slow", "node-1", 1000*gi, 900*gi),
		localPool("bulk", "node-1", gi, gi))
	r := e.reconciler(t, "node-1")

	writes := e.sync(t, r)
	if len(writes) != 6 {
		t.Errorf("first sync wrote %v, want apply and apply_status for each of 3 pools", writes)
	}
	obj := e.api.Get("fast.node-1")
	if obj == nil {
		t.Fatal("fast.node-1 not created")
	}
	if obj.Spec.Driver != consts.DriverName || obj.Spec.Parameters[consts.ParamPool] != "fast" ||
		fmt.Sprint(obj.Status.AccessibleNodes) != "[node-1]" || obj.Status.Capacity.Total.Value() != 100*gi ||
		obj.Status.Capacity.Available.Value() != 60*gi || healthy(obj).Status != metav1.ConditionTrue ||
		obj.Labels[consts.LabelPool] != "fast" || obj.Labels[consts.LabelNode] != "node-1" {
		t.Errorf("object = %+v", obj)
	}

	t.Run("nothing changed, nothing written", func(t *testing.T) {
		if writes := e.sync(t, r); len(writes) != 0 {
			t.Errorf("writes = %v, want none", writes)
		}
	})

	t.Run("one capacity change, one write", func(t *testing.T) {
		e.driver.set(localPool("fast", "node-1", 100*gi, 50*gi), localPool("slow", "node-1", 1000*gi, 900*gi),
			localPool("bulk", "node-1", gi, gi))
		writes := e.sync(t, r)
		if !slices.Equal(writes, []string{"apply_status fast.node-1"}) {
			t.Errorf("writes = %v, want one status apply", writes)
		}
		if got := e.api.Get("fast.node-1").Status.Capacity.Available.Value(); got != 50*gi {
			t.Errorf("available = %d", got)
		}
	})

	t.Run("a restarted sidecar writes nothing", func(t *testing.T) {
		if writes := e.sync(t, e.reconciler(t, "node-1")); len(writes) != 0 {
			t.Errorf("writes = %v, want none", writes)
		}
	})

	t.Run("removed pool is deleted", func(t *testing.T) {
		e.driver.set(localPool("fast", "node-1", 100*gi, 50*gi), localPool("slow", "node-1", 1000*gi, 900*gi))
		if writes := e.sync(t, r); !slices.Equal(writes, []string{"delete bulk.node-1"}) {
			t.Errorf("writes = %v", writes)
		}
	})
}

func TestSyncDriverUnreachableKeepsPools(t *testing.T) {
	e := newEnv(t)
	e.driver.set(localPool("fast", "node-1", 100*gi, 60*gi))
	r := e.reconciler(t, "node-1")
	e.sync(t, r)

	e.driver.fail(status.Error(codes.Unavailable, "driver restarting"))
	if err := r.Sync(e.ctx); err == nil {
		t.Fatal("Sync succeeded with an unreachable driver")
	}
	if writes := e.api.takeWrites(); !slices.Equal(writes, []string{"apply_status fast.node-1"}) {
		t.Errorf("writes = %v, want only the recorded error", writes)
	}
	obj := e.api.Get("fast.node-1")
	if obj == nil {
		t.Fatal("pool deleted while the driver was unreachable")
	}
	if c := healthy(obj); c.Status != metav1.ConditionUnknown || c.Reason != spapi.ReasonDriverUnreachable {
		t.Errorf("Healthy = %+v", c)
	}
	if n := len(obj.Status.Errors); n != 1 {
		t.Errorf("errors = %+v", obj.Status.Errors)
	}
	if obj.Status.Capacity.Total.Value() != 100*gi {
		t.Errorf("capacity lost: %+v", obj.Status.Capacity)
	}
	_ = r.Sync(e.ctx)
	if writes := e.api.takeWrites(); len(writes) != 0 {
		t.Errorf("the same error was recorded again: %v", writes)
	}

	e.driver.fail(nil)
	e.driver.set(localPool("fast", "node-1", 100*gi, 60*gi))
	e.sync(t, r)
	obj = e.api.Get("fast.node-1")
	if c := healthy(obj); c.Status != metav1.ConditionTrue {
		t.Errorf("Healthy after recovery = %+v", c)
	}
	if len(obj.Status.Errors) != 1 {
		t.Errorf("the outage should stay in the error log: %+v", obj.Status.Errors)
	}
}

func TestSyncErrorsBounded(t *testing.T) {
	e := newEnv(t)
	r := e.reconciler(t, "node-1")
	r.cfg.MaxErrors = 3
	t0 := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	for i := range 6 {
		p := localPool("fast", "node-1", gi, 0)
		p.Healthy = false
		p.Errors = append(p.Errors, &spv1.StoragePoolError{Message: fmt.Sprintf("error %d", i)})
		p.Errors[0].Time = timestamp(t0.Add(time.Duration(i) * time.Minute))
		e.driver.set(p)
		e.sync(t, r)
	}
	errs := e.api.Get("fast.node-1").Status.Errors
	if len(errs) != 3 || errs[0].Message != "error 3" || errs[2].Message != "error 5" {
		t.Errorf("errors = %+v, want the newest 3", errs)
	}
}

func TestSyncLeavesOthersObjectsAlone(t *testing.T) {
	e := newEnv(t)
	// node-2's pool and another driver's object with the name our pool wants.
	e.driver.set(localPool("fast", "node-2", gi, gi))
	e.sync(t, e.reconciler(t, "node-2"))
	newFakeAPIObject(t, e.api, "slow.node-1", "other.csi.dev")

	e.driver.set(localPool("slow", "node-1", gi, gi))
	r := e.reconciler(t, "node-1")
	if err := r.Sync(e.ctx); err == nil {
		t.Error("want an error for the name taken by another driver")
	}
	writes := e.api.takeWrites()
	if len(writes) != 0 {
		t.Errorf("writes = %v, want none", writes)
	}
	if e.api.Get("fast.node-2") == nil {
		t.Error("node-1's sidecar deleted node-2's pool")
	}
	if got := e.api.Get("slow.node-1"); got.Spec.Driver != "other.csi.dev" {
		t.Errorf("another driver's object was changed: %+v", got)
	}
}

func newFakeAPIObject(t *testing.T, api *fakeAPI, name, driver string) *spapi.StoragePool {
	t.Helper()
	d := &desiredPool{name: name, labels: map[string]string{}, spec: spapi.StoragePoolSpec{Driver: driver}}
	obj, err := api.Apply(context.Background(), d.metaApplyConfig(), metav1.ApplyOptions{FieldManager: "someone-else"})
	if err != nil {
		t.Fatal(err)
	}
	api.takeWrites()
	return obj
}

func TestSyncSharedPool(t *testing.T) {
	e := newEnv(t)
	nfs := func(node string) *spv1.StoragePool {
		p := localPool("nfs", node, 10*gi, 5*gi)
		p.Shared = true
		return p
	}
	d1, d2 := &fakeDriver{}, &fakeDriver{}
	d1.set(nfs("node-1"), localPool("fast", "node-1", gi, gi))
	d2.set(nfs("node-2"))
	mk := func(d *fakeDriver, node string) *Reconciler {
		r, err := NewReconciler(Config{DriverName: consts.DriverName, NodeName: node, ResyncPeriod: time.Hour},
			startFakeDriver(t, d, 0), e.api, e.api, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r1, r2 := mk(d1, "node-1"), mk(d2, "node-2")
	e.sync(t, r1)
	e.sync(t, r2)
	obj := e.api.Get("nfs")
	if obj == nil || fmt.Sprint(obj.Status.AccessibleNodes) != "[node-1 node-2]" {
		t.Fatalf("shared pool = %+v, want both nodes", obj)
	}
	if obj.Labels[consts.LabelShared] != "true" || obj.Labels[consts.LabelNode] != "" {
		t.Errorf("labels = %v", obj.Labels)
	}
	for _, r := range []*Reconciler{r1, r2, r1} {
		if writes := e.sync(t, r); len(writes) != 0 {
			t.Errorf("%s wrote %v, want nothing (no flapping)", r.manager, writes)
		}
	}

	d2.set()
	e.sync(t, r2)
	obj = e.api.Get("nfs")
	if obj == nil || fmt.Sprint(obj.Status.AccessibleNodes) != "[node-1]" {
		t.Fatalf("after node-2 left: %+v", obj)
	}
	if writes := e.sync(t, r2); len(writes) != 0 {
		t.Errorf("node-2 keeps writing after leaving: %v", writes)
	}
	d1.set(localPool("fast", "node-1", gi, gi))
	if writes := e.sync(t, r1); !slices.Equal(writes, []string{"delete nfs"}) {
		t.Errorf("writes = %v, want the last node to delete the shared pool", writes)
	}
}

func TestRunFollowsDriverChanges(t *testing.T) {
	e := newEnv(t)
	r := e.reconciler(t, "node-1")
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	go r.Run(ctx)

	e.driver.set(localPool("fast", "node-1", gi, gi))
	// The resync period is an hour: only the driver's watch stream can trigger this sync.
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return e.api.Get("fast.node-1") != nil, nil
	})
	if err != nil {
		t.Fatalf("pool not published after a driver change: %v", err)
	}
}
