package workloads_test

import (
	"fmt"
	"testing"
	"time"

	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/cistern-csi/cistern/test/workloads/testutil"
)

// reconcileMark counts a controller's work from a point on, so that a test checking that
// nothing happened first sees the controller take in the change and handle it, rather than
// sleeping a fixed time (a broken or stalled controller would pass a sleep). The controller runs
// in the test binary, its metrics in controller-runtime's registry; the package's tests run one
// at a time.
type reconcileMark struct {
	controllers []string
	adds        map[string]float64
}

// markReconciles records how many items the controllers' queues have taken so far.
func markReconciles(t *testing.T, controllers ...string) reconcileMark {
	t.Helper()
	m := reconcileMark{controllers: controllers, adds: map[string]float64{}}
	for _, c := range controllers {
		m.adds[c] = queueStats(t, c).adds
	}
	return m
}

// wait returns once each controller's queue has taken at least one item since the mark and
// every item is handled: nothing queued and no reconcile running, seen twice in a row with no
// new item between (the metrics are not read atomically).
func (m reconcileMark) wait(t *testing.T, what string) {
	t.Helper()
	var last map[string]queue
	testutil.Eventually(t, time.Minute, what+": the controllers took in the change and went idle", func() error {
		now := map[string]queue{}
		for _, c := range m.controllers {
			q := queueStats(t, c)
			now[c] = q
			if q.adds <= m.adds[c] {
				return fmt.Errorf("%s: no item queued since the change", c)
			}
			if q.depth > 0 || q.active > 0 {
				last = nil
				return fmt.Errorf("%s: %v queued, %v reconciling", c, q.depth, q.active)
			}
			if last != nil && last[c].adds != q.adds {
				last = now
				return fmt.Errorf("%s: took more items", c)
			}
		}
		if last == nil {
			last = now
			return fmt.Errorf("idle once; checking again")
		}
		return nil
	})
}

type queue struct{ adds, depth, active float64 }

// queueStats reads a controller's queue counters from controller-runtime's metrics; a series
// that is not there fails the test (the controller is not running under that name).
func queueStats(t *testing.T, controller string) queue {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gathering controller metrics: %v", err)
	}
	var q queue
	seen := map[string]bool{}
	for _, f := range families {
		var dst *float64
		switch f.GetName() {
		case "workqueue_adds_total":
			dst = &q.adds
		case "workqueue_depth":
			dst = &q.depth
		case "controller_runtime_active_workers":
			dst = &q.active
		default:
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == controller {
					seen[f.GetName()] = true
					*dst += s.GetCounter().GetValue() + s.GetGauge().GetValue()
				}
			}
		}
	}
	for _, name := range []string{"workqueue_adds_total", "workqueue_depth", "controller_runtime_active_workers"} {
		if !seen[name] {
			t.Fatalf("no %s{controller=%q} in controller-runtime's metrics", name, controller)
		}
	}
	return q
}
