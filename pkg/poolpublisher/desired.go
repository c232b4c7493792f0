package poolpublisher

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	spac "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1/applyconfiguration/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	spv1 "github.com/cistern-csi/cistern/pkg/rpc/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/units"
)

// maxMessageLen bounds one error message, so that a chatty driver cannot grow objects.
const maxMessageLen = 1024

// desiredPool is one pool as this sidecar wants it published.
type desiredPool struct {
	name   string
	pool   *spv1.StoragePool
	nodes  []string
	shared bool
	labels map[string]string
	spec   spapi.StoragePoolSpec
}

// newDesiredPool checks a pool report and derives its object name, labels and spec.
func newDesiredPool(p *spv1.StoragePool, driverName, nodeName string) (*desiredPool, error) {
	if p.GetName() == "" {
		return nil, fmt.Errorf("driver reported a pool without a name")
	}
	nodes := nodesOf(p)
	shared := p.GetShared() || len(nodes) > 1
	if !shared && len(nodes) != 1 {
		return nil, fmt.Errorf("pool %q: a pool that is not shared must report exactly one node in its accessible topology (key %s), got %d",
			p.GetName(), consts.TopologyKey, len(nodes))
	}
	d := &desiredPool{
		pool:   p,
		nodes:  nodes,
		shared: shared,
		labels: poolLabels(p.GetLabels()),
		spec:   spapi.StoragePoolSpec{Driver: driverName, Parameters: p.GetParameters()},
	}
	d.labels[consts.LabelPool] = LabelValue(p.GetName())
	if !shared {
		for _, c := range p.GetCache().GetDatasets() {
			if c.GetState() == spv1.DatasetState_DATASET_STATE_READY && len(validation.IsQualifiedName(consts.LabelDatasetPrefix+c.GetId())) == 0 {
				d.labels[consts.LabelDatasetPrefix+c.GetId()] = "true"
			}
		}
	}
	if shared {
		d.name = ObjectName(p.GetName(), "", true)
		d.labels[consts.LabelShared] = "true"
	} else {
		if nodeName != "" && nodes[0] != nodeName {
			return nil, fmt.Errorf("pool %q is on node %q, but this sidecar publishes the pools of node %q",
				p.GetName(), nodes[0], nodeName)
		}
		d.name = ObjectName(p.GetName(), nodes[0], false)
		d.labels[consts.LabelNode] = LabelValue(nodes[0])
	}
	return d, nil
}

// nodesOf returns the sorted node names of a pool's accessible topology.
func nodesOf(p *spv1.StoragePool) []string {
	var nodes []string
	for _, t := range p.GetAccessibleTopology() {
		if n := t.GetSegments()[consts.TopologyKey]; n != "" && !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
	}
	slices.Sort(nodes)
	return nodes
}

// poolLabels copies the pool's own labels (those a poolSelector matches) that are valid object
// labels, so `kubectl get storagepools -l media=ssd` shows what a selector would pick. Keys in
// Cistern's own namespace are reserved for the sidecar.
func poolLabels(in map[string]string) map[string]string {
	out := make(map[string]string, len(in)+2)
	for k, v := range in {
		if strings.HasPrefix(k, "cistern.csi.dev/") || strings.HasPrefix(k, consts.LabelDatasetPrefix) ||
			len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0 {
			continue
		}
		out[k] = v
	}
	return out
}

// metaApplyConfig is what this sidecar applies to the object itself: labels and spec.
func (d *desiredPool) metaApplyConfig() *spac.StoragePoolApplyConfiguration {
	return spac.StoragePool(d.name).
		WithLabels(d.labels).
		WithSpec(spac.StoragePoolSpec().WithDriver(d.spec.Driver).WithParameters(d.spec.Parameters))
}

// status builds the status this sidecar reports for the pool. own is the status this sidecar
// wrote last (its own fields only), current the object as it is now (nil when it does not exist
// yet); errors are a log: the driver's errors are merged into the ones already published and the
// newest maxErrors kept.
func (d *desiredPool) status(own, current *spapi.StoragePool, reporter string, maxErrors int, now time.Time) spapi.StoragePoolStatus {
	p := d.pool
	st := spapi.StoragePoolStatus{
		AccessibleNodes: d.nodes,
		Capacity: &spapi.PoolCapacity{
			Total:     resource.NewQuantity(p.GetTotalBytes(), resource.BinarySI),
			Available: resource.NewQuantity(p.GetAvailableBytes(), resource.BinarySI),
		},
	}
	if p.GetMaximumVolumeBytes() > 0 {
		st.Capacity.MaximumVolumeSize = resource.NewQuantity(p.GetMaximumVolumeBytes(), resource.BinarySI)
	}
	if c := p.GetCache(); c != nil && !d.shared {
		st.Cache = datasetCache(c)
	}
	st.Printed = printed(p, d.shared)
	prefix := ""
	if d.shared && reporter != "" {
		// Several nodes write errors into one shared object: say which node saw each.
		prefix = reporter + ": "
	}
	var reported []spapi.StoragePoolError
	for _, e := range p.GetErrors() {
		reported = append(reported, spapi.StoragePoolError{
			Time:    metav1.NewTime(e.GetTime().AsTime()),
			Message: prefix + e.GetMessage(),
		})
	}
	st.Errors = mergeErrors(ownErrors(own), reported, maxErrors)

	cond := metav1.Condition{
		Type:   spapi.ConditionHealthy,
		Status: metav1.ConditionTrue,
		Reason: spapi.ReasonPoolHealthy,
	}
	if !p.GetHealthy() {
		cond.Status = metav1.ConditionFalse
		cond.Reason = spapi.ReasonPoolUnhealthy
		cond.Message = "the driver reports the pool unhealthy"
		if n := len(p.GetErrors()); n > 0 {
			cond.Message = truncate(prefix + p.GetErrors()[n-1].GetMessage())
		}
	}
	setCondition(&st, current, cond, now)
	return st
}

// printed is the pool's sizes in human units, for the printer columns (no cache for a shared
// pool, as status.cache).
func printed(p *spv1.StoragePool, shared bool) *spapi.PrintedSizes {
	out := &spapi.PrintedSizes{Total: units.HumanBytes(p.GetTotalBytes()), Available: units.HumanBytes(p.GetAvailableBytes())}
	if c := p.GetCache(); c != nil && !shared {
		out.Cached = units.HumanBytes(c.GetBytes())
	}
	return out
}

// unreachableStatus is the status to report when the driver cannot be asked: the pool is kept
// with its last capacity, Healthy turns Unknown and the error is logged once per distinct message.
func unreachableStatus(own, current *spapi.StoragePool, reporter string, cause error, maxErrors int, now time.Time) spapi.StoragePoolStatus {
	st := *own.Status.DeepCopy()
	msg := truncate("driver unreachable: " + cause.Error())
	if reporter != "" && current != nil && current.Labels[consts.LabelShared] == "true" {
		msg = truncate(reporter + ": " + msg)
	}
	errs := ownErrors(own)
	if len(errs) == 0 || errs[len(errs)-1].Message != msg {
		errs = mergeErrors(errs, []spapi.StoragePoolError{{Time: metav1.NewTime(now), Message: msg}}, maxErrors)
	}
	st.Errors = errs
	setCondition(&st, current, metav1.Condition{
		Type:    spapi.ConditionHealthy,
		Status:  metav1.ConditionUnknown,
		Reason:  spapi.ReasonDriverUnreachable,
		Message: msg,
	}, now)
	return st
}

// cacheStates maps the driver's dataset states to the API's.
var cacheStates = map[spv1.DatasetState]spapi.DatasetState{
	spv1.DatasetState_DATASET_STATE_STAGING:    spapi.DatasetStaging,
	spv1.DatasetState_DATASET_STATE_READY:      spapi.DatasetReady,
	spv1.DatasetState_DATASET_STATE_FAILED:     spapi.DatasetFailed,
	spv1.DatasetState_DATASET_STATE_INCOMPLETE: spapi.DatasetIncomplete,
}

// datasetCache is the published inventory of a pool's cache. Last use is kept at the second the
// API stores, so that an unchanged inventory compares equal to the one published.
func datasetCache(c *spv1.DatasetCache) *spapi.DatasetCache {
	out := &spapi.DatasetCache{
		Bytes: resource.NewQuantity(c.GetBytes(), resource.BinarySI),
		Total: c.GetTotal(), Ready: c.GetReady(), Staging: c.GetStaging(), Failed: c.GetFailed(),
	}
	seen := map[string]bool{}
	for _, e := range c.GetDatasets() {
		state, ok := cacheStates[e.GetState()]
		if !ok || e.GetId() == "" || seen[e.GetId()] {
			continue // a state this sidecar does not know, or a duplicate: not published
		}
		seen[e.GetId()] = true
		ds := spapi.CachedDataset{
			ID: e.GetId(), Source: truncate(e.GetSource()), Scheme: e.GetScheme(), Tenant: e.GetTenant(),
			State: state, Reason: truncate(e.GetReason()), BytesDone: e.GetBytesDone(), BytesTotal: e.GetBytesTotal(),
			References: e.GetReferences(),
		}
		if e.GetLastUsed() != nil {
			t := metav1.NewTime(e.GetLastUsed().AsTime().UTC().Truncate(time.Second))
			ds.LastUsed = &t
		}
		out.Datasets = append(out.Datasets, ds)
	}
	out.OutputsTotal = c.GetOutputsTotal()
	for _, o := range c.GetOutputs() {
		if o.GetVolume() == "" || seen["output/"+o.GetVolume()] {
			continue
		}
		seen["output/"+o.GetVolume()] = true
		out.Outputs = append(out.Outputs, spapi.VolumeOutputs{Volume: truncate(o.GetVolume()), InUse: o.GetInUse(),
			Uploading: o.GetUploading(), Failing: o.GetFailing(), BytesPending: o.GetBytesPending()})
	}
	if out.OutputsTotal < int32(len(out.Outputs)) {
		out.OutputsTotal = int32(len(out.Outputs))
	}
	return out
}

func ownErrors(own *spapi.StoragePool) []spapi.StoragePoolError {
	if own == nil {
		return nil
	}
	return own.Status.Errors
}

// mergeErrors returns the union of two error logs at second precision (what the API stores),
// without duplicates, oldest first, cut to the newest max entries.
func mergeErrors(a, b []spapi.StoragePoolError, max int) []spapi.StoragePoolError {
	type key struct {
		t int64
		m string
	}
	seen := map[key]bool{}
	var out []spapi.StoragePoolError
	for _, e := range slices.Concat(a, b) {
		e.Time = metav1.NewTime(e.Time.UTC().Truncate(time.Second))
		e.Message = truncate(e.Message)
		k := key{e.Time.Unix(), e.Message}
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, e)
	}
	slices.SortStableFunc(out, func(x, y spapi.StoragePoolError) int {
		if c := x.Time.Compare(y.Time.Time); c != 0 {
			return c
		}
		return strings.Compare(x.Message, y.Message)
	})
	if max > 0 && len(out) > max {
		out = out[len(out)-max:]
	}
	return out
}

// setCondition sets cond in st, keeping the transition time of the current object's condition
// when the status did not change, and stamping the generation the status was computed for.
func setCondition(st *spapi.StoragePoolStatus, current *spapi.StoragePool, cond metav1.Condition, now time.Time) {
	cond.LastTransitionTime = metav1.NewTime(now.UTC().Truncate(time.Second))
	if current != nil {
		for _, c := range current.Status.Conditions {
			if c.Type == cond.Type && c.Status == cond.Status {
				cond.LastTransitionTime = c.LastTransitionTime
			}
		}
		cond.ObservedGeneration = current.Generation
		st.ObservedGeneration = current.Generation
	}
	st.Conditions = []metav1.Condition{cond}
}

func truncate(s string) string {
	if len(s) <= maxMessageLen {
		return s
	}
	return s[:maxMessageLen-3] + "..."
}

// statusApplyConfig turns a status into the apply configuration for the status subresource.
// It goes through JSON so that it has exactly the fields an extraction of the same status from
// managedFields has, which makes "nothing changed" a plain comparison.
func statusApplyConfig(name string, st spapi.StoragePoolStatus) (*spac.StoragePoolApplyConfiguration, error) {
	data, err := json.Marshal(map[string]any{"status": st})
	if err != nil {
		return nil, err
	}
	ac := spac.StoragePool(name)
	if err := json.Unmarshal(data, ac); err != nil {
		return nil, err
	}
	return ac, nil
}

// typedFromApplyConfig turns an extracted apply configuration back into a typed object.
func typedFromApplyConfig(ac *spac.StoragePoolApplyConfiguration) (*spapi.StoragePool, error) {
	data, err := json.Marshal(ac)
	if err != nil {
		return nil, err
	}
	obj := &spapi.StoragePool{}
	return obj, json.Unmarshal(data, obj)
}
