package volume

import (
	"slices"
	"strings"

	"github.com/cistern-csi/cistern/pkg/consts"
)

// Output is what one volume's outputs hold on the node: the node plugin reports these in its
// pools' inventories (StoragePool status.cache.outputs), so that a VolumeManager is Completed only
// once no node holds outputs of its volumes that are not at their targets. The workload-controller
// reads them there: it needs no access to the node, the target or the tenant's credentials.
type Output struct {
	// Volume is the volume ID; for the per-pod copies of a static PV, the PV's volume handle
	// (every copy of it counts here).
	Volume string
	// InUse counts publications (or a claim's staging) whose upload starts when they are let go.
	InUse int
	// Uploading counts volumes handed off and not all at the target yet; Failing those of them
	// whose last pass failed (retried with backoff; the pod's or claim's Events say why).
	Uploading, Failing int
	// BytesPending is what the uploading volumes still hold for their targets (their capacity
	// until the first pass measured the changes).
	BytesPending int64
}

// Outputs lists, by volume, the outputs not at their targets yet of the volumes in pool: those
// whose pods still use them and those being uploaded. Sorted by volume.
func (s *Service) Outputs(pool string) []Output {
	if s.wb == nil {
		return nil
	}
	by := map[string]*Output{}
	for _, v := range s.store.ListVolumes() {
		if v.Pool != pool || v.Parameters[consts.ParamOutputTarget] == "" {
			continue
		}
		key := v.ID
		if v.CopyOf != "" {
			key = v.CopyOf
		}
		o := by[key]
		if o == nil {
			o = &Output{Volume: key}
		}
		switch {
		case len(v.Published) > 0 || v.StagingPath != "":
			o.InUse++
		case s.WriteBackHolds(v.ID) != "":
			o.Uploading++
			s.wb.mu.Lock()
			o.BytesPending += s.wb.pending[v.ID]
			if s.wb.failing[v.ID] {
				o.Failing++
			}
			s.wb.mu.Unlock()
		default:
			continue // nothing written back: a claim neither staged nor uploading
		}
		by[key] = o
	}
	out := make([]Output, 0, len(by))
	for _, o := range by {
		out = append(out, *o)
	}
	slices.SortFunc(out, func(a, b Output) int { return strings.Compare(a.Volume, b.Volume) })
	return out
}

// OutputsGeneration moves whenever a volume's outputs change state on the node (published,
// handed off, failed, uploaded); the channel is closed at the next move. Byte progress does not
// move it: the pool report's bytes are as of the last move or resync.
func (s *Service) OutputsGeneration() (uint64, <-chan struct{}) {
	if s.wb == nil {
		return 0, nil
	}
	s.wb.mu.Lock()
	defer s.wb.mu.Unlock()
	return s.wb.gen, s.wb.changed
}

// outputsChanged moves OutputsGeneration; w.mu is held.
func (w *writeBacks) outputsChanged() {
	w.gen++
	close(w.changed)
	w.changed = make(chan struct{})
}

// publishedOutput tells the pool report that a volume naming an output target was published.
func (s *Service) publishedOutput(attrs map[string]string) {
	if s.wb == nil || attrs[consts.ParamOutputTarget] == "" {
		return
	}
	s.wb.mu.Lock()
	s.wb.outputsChanged()
	s.wb.mu.Unlock()
}
