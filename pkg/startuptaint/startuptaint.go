// Package startuptaint removes the startup taint (consts.StartupTaintKey) from the node plugin's
// own Node once the plugin can serve volumes there: its CSI socket is listening and kubelet has
// registered it (the node's CSINode lists the driver). Until then the taint keeps off the node the
// pods that would otherwise fail their first mounts with "driver not found in the list of
// registered CSI drivers" (or, with NoExecute, evicts those that came first).
//
// Only that taint is removed, by a JSON patch of "remove" operations at its indexes, guarded by
// the resourceVersion read: a Node changed in between (kube-controller-manager adds and drops
// its own taints) is a 409 Conflict and is read again. The node plugin's ServiceAccount is
// shared by every node, so deploy/csi's cistern-node-startup-taint admission policy admits
// nothing else: the Node the request's token is bound to, and no change but this taint going.
//
// A plugin that never gets registered keeps its taint: a node where Cistern cannot mount should
// not take pods that need it (unlike drivers that remove it after a timeout regardless).
package startuptaint

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/consts"
)

// Key is the taint removed.
const Key = consts.StartupTaintKey

// registrationPoll is how often the CSINode is read while kubelet has not registered the
// driver: node-driver-registrar registers it within seconds of the socket listening. (A
// variable for the tests.)
var registrationPoll = 2 * time.Second

// removalBackoff spaces attempts that fail for other reasons than a conflict (the API server
// unreachable while the node starts, a refusal logged for the administrator): up to a minute
// apart, for as long as the plugin runs.
var removalBackoff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Cap: time.Minute, Steps: math.MaxInt32}

// Run waits until ready is closed and kubelet has registered driver on node, then removes the
// startup taint from node. It returns nil once the taint is gone (or was never there), or the
// context's error.
func Run(ctx context.Context, client kubernetes.Interface, node, driver string, ready <-chan struct{}) error {
	logger := klog.FromContext(ctx).WithValues("node", node, "taint", Key)
	ctx = klog.NewContext(ctx, logger)
	select {
	case <-ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := waitRegistered(ctx, client, node, driver); err != nil {
		return err
	}
	return wait.ExponentialBackoffWithContext(ctx, removalBackoff, func(ctx context.Context) (bool, error) {
		removed, err := Remove(ctx, client.CoreV1().Nodes(), node)
		if err != nil {
			logger.Error(err, "Cannot remove the startup taint; retrying")
			return false, nil
		}
		if removed {
			logger.Info("Removed the startup taint: the node plugin serves and is registered")
		} else {
			logger.V(3).Info("No startup taint to remove")
		}
		return true, nil
	})
}

// waitRegistered returns once node's CSINode lists driver.
func waitRegistered(ctx context.Context, client kubernetes.Interface, node, driver string) error {
	logger := klog.FromContext(ctx)
	return wait.PollUntilContextCancel(ctx, registrationPoll, true, func(ctx context.Context) (bool, error) {
		cn, err := client.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			if !apierrors.IsNotFound(err) {
				logger.Error(err, "Cannot read the CSINode; retrying")
			}
			return false, nil
		}
		for _, d := range cn.Spec.Drivers {
			if d.Name == driver {
				return true, nil
			}
		}
		logger.V(3).Info("Waiting for kubelet to register the driver", "driver", driver)
		return false, nil
	})
}

// Remove removes the startup taint from node, reading it again on a conflict. It reports whether
// there was one to remove.
func Remove(ctx context.Context, nodes corev1client.NodeInterface, node string) (bool, error) {
	removed := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		patch, ok := Patch(n)
		if !ok {
			removed = false
			return nil
		}
		_, err = nodes.Patch(ctx, node, types.JSONPatchType, patch, metav1.PatchOptions{})
		removed = err == nil
		return err
	})
	return removed, err
}

// jsonPatchOp is one RFC 6902 operation.
type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value string `json:"value,omitempty"` // only replace has one
}

// Patch returns the JSON patch that removes the startup taint from n as read, and false when n
// has none. Its first operation sets n's resourceVersion, which the API server takes as a
// precondition (409 Conflict if the Node has changed since); the removals go from the last index
// to the first, so that each index is still the one read.
func Patch(n *corev1.Node) ([]byte, bool) {
	var ops []jsonPatchOp
	for i, t := range slices.Backward(n.Spec.Taints) {
		if t.Key == Key {
			ops = append(ops, jsonPatchOp{Op: "remove", Path: "/spec/taints/" + strconv.Itoa(i)})
		}
	}
	if len(ops) == 0 {
		return nil, false
	}
	ops = slices.Insert(ops, 0, jsonPatchOp{Op: "replace", Path: "/metadata/resourceVersion", Value: n.ResourceVersion})
	data, err := json.Marshal(ops)
	if err != nil {
		panic(fmt.Sprintf("marshalling a JSON patch of strings: %v", err)) // cannot fail
	}
	return data, true
}
