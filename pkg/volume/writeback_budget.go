package volume

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The node's budget for outputs not uploaded yet (--writeback-max-pending-bytes) is shared among
// namespaces (docs/security.md, "Write-back"): a namespace's pending uploads count against it up
// to the namespace's share (--writeback-max-pending-bytes-per-namespace), and while the
// namespace holds its share its new volumes naming an output target are refused. So a tenant
// whose target refuses (its uploads pending and retried until --writeback-max-age) takes at most
// its share of the node's budget, not the other tenants' room. The namespace is the pod's
// (inline volumes, static PV copies) or the claim's (external-provisioner's
// --extra-create-metadata); volumes that name neither share one, "".

// share is a namespace's share of the node's budget; 0 for none.
func (w *writeBacks) share() int64 {
	if n := w.cfg.MaxPendingBytesPerNamespace; n > 0 {
		return n
	}
	return w.cfg.MaxPendingBytes / 4
}

// outputUsage is what the node's uploads hold, by namespace, and what of it counts against the
// node's budget: each namespace's up to its share.
type outputUsage struct {
	byNamespace map[string]int64
	total       int64
	counted     int64
}

func (w *writeBacks) usage() outputUsage {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := outputUsage{byNamespace: map[string]int64{}}
	for id, n := range w.pending {
		b.byNamespace[w.namespace[id]] += n
		b.total += n
	}
	share := w.share()
	for _, n := range b.byNamespace {
		if share > 0 {
			n = min(n, share)
		}
		b.counted += n
	}
	return b
}

// admit is the budget's check of a new volume of namespace ns that names an output target.
func (w *writeBacks) admit(node, ns string) error {
	b := w.usage()
	if share := w.share(); share > 0 && b.byNamespace[ns] >= share {
		return status.Errorf(codes.ResourceExhausted, "namespace %q holds %d bytes of outputs not uploaded yet on node %s, its share of the node's budget (--writeback-max-pending-bytes-per-namespace: %d); retry later",
			ns, b.byNamespace[ns], node, share)
	}
	if max := w.cfg.MaxPendingBytes; max > 0 && b.counted >= max {
		return status.Errorf(codes.ResourceExhausted, "node %s holds %d bytes of outputs not uploaded yet, the most --writeback-max-pending-bytes allows; retry later", node, b.counted)
	}
	return nil
}
