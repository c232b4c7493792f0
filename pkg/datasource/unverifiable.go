package datasource

// Objects nothing can check (source.Unverifiable): an old S3 server that reports no checksum and
// no part size, with a multipart ETag that matches under no likely part size. The administrator
// chooses whether they are refused (the default) or served unchecked; either way it is counted,
// logged and told (an Event on the node).

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// UnverifiablePolicy is what the node does with objects nothing can check (flag
// --unverifiable-objects).
type UnverifiablePolicy string

const (
	// RefuseUnverifiable fails the staging (or the streaming read) of such an object.
	RefuseUnverifiable UnverifiablePolicy = "refuse"
	// ServeUnverifiable serves such an object unchecked.
	ServeUnverifiable UnverifiablePolicy = "serve"
)

// UnverifiableEvent is an object nothing could check, and what became of it.
type UnverifiableEvent struct {
	// Dataset is the dataset's ID; Key the object's key in it.
	Dataset, Key string
	// Served is set when the object was served unchecked, unset when it was refused.
	Served bool
	// Reason says why nothing could check it.
	Reason string
}

// ParseUnverifiablePolicy reads the flag's value; empty is RefuseUnverifiable.
func ParseUnverifiablePolicy(s string) (UnverifiablePolicy, error) {
	p := UnverifiablePolicy(s)
	if p == "" {
		p = RefuseUnverifiable
	}
	return p, p.validate()
}

func (p UnverifiablePolicy) validate() error {
	switch p {
	case RefuseUnverifiable, ServeUnverifiable:
		return nil
	}
	return fmt.Errorf("unverifiable objects policy %q is neither %q nor %q", string(p), RefuseUnverifiable, ServeUnverifiable)
}

// unverifiable applies the node's policy to obj of dataset id, which nothing can check (err): nil
// serves it, err refuses it.
func (m *Manager) unverifiable(ctx context.Context, id string, obj source.Object, err error) error {
	served := m.cfg.UnverifiableObjects == ServeUnverifiable
	action := "refused"
	if served {
		action = "served"
	}
	m.metrics.unverifiable.WithLabelValues(action).Inc()
	klog.FromContext(ctx).Info("Object has nothing to check it by", "dataset", id, "key", obj.Key, "action", action, "reason", err)
	if m.cfg.OnUnverifiable != nil {
		m.cfg.OnUnverifiable(UnverifiableEvent{Dataset: id, Key: obj.Key, Served: served, Reason: err.Error()})
	}
	if served {
		return nil
	}
	return err
}
