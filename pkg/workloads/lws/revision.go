package lws

import (
	"context"
	"encoding/json"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

// Template revisions. During a rolling update the leader StatefulSet keeps the old pod template for
// the groups below its partition (in the StatefulSet controller's own history), but worker
// StatefulSets are built by this controller whenever a leader (re)starts. So that a group restarted
// in the middle of an update, or a rollback, gets the workers of its own revision, each template
// revision is kept in a ControllerRevision owned by the LeaderWorkerSet, as upstream does: named
// <lws>-<template-revision-hash>-<number>, labelled with the set name and the hash, holding the
// parts of the spec the hash covers. Revisions no group uses any more are deleted once an update
// is complete.

// revisionData is what a ControllerRevision holds: exactly what TemplateHash covers.
type revisionData struct {
	Spec revisionSpec `json:"spec"`
}

type revisionSpec struct {
	LeaderWorkerTemplate v1alpha1.LeaderWorkerTemplate `json:"leaderWorkerTemplate"`
	NetworkConfig        *v1alpha1.NetworkConfig       `json:"networkConfig,omitempty"`
	// The exclusive-placement annotations of the LeaderWorkerSet at this revision.
	ExclusiveTopology         string `json:"exclusiveTopology,omitempty"`
	SubGroupExclusiveTopology string `json:"subGroupExclusiveTopology,omitempty"`
}

// NewRevision builds revision number of the defaulted lws, whose template hash is key, owned by
// lws as kind (the LeaderWorkerSet's group depends on the API the controller serves).
func NewRevision(lws *v1alpha1.LeaderWorkerSet, kind schema.GroupVersionKind, key string, number int64) (*appsv1.ControllerRevision, error) {
	raw, err := json.Marshal(revisionData{Spec: revisionSpec{
		LeaderWorkerTemplate:      lws.Spec.LeaderWorkerTemplate,
		NetworkConfig:             lws.Spec.NetworkConfig,
		ExclusiveTopology:         lws.Annotations[v1alpha1.ExclusiveKeyAnnotationKey],
		SubGroupExclusiveTopology: lws.Annotations[v1alpha1.SubGroupExclusiveKeyAnnotationKey],
	}})
	if err != nil {
		return nil, err
	}
	return &appsv1.ControllerRevision{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "ControllerRevision"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      revisionName(lws.Name, key, number),
			Namespace: lws.Namespace,
			Labels:    map[string]string{v1alpha1.SetNameLabelKey: lws.Name, v1alpha1.RevisionKey: key},
			OwnerReferences: []metav1.OwnerReference{
				*metav1.NewControllerRef(lws, kind),
			},
		},
		Data:     runtime.RawExtension{Raw: raw},
		Revision: number,
	}, nil
}

// revisionName is <lws>-<key>-<number>; the number keeps a revision recreated after a rollback
// from colliding with its earlier incarnation.
func revisionName(lwsName, key string, number int64) string {
	return fmt.Sprintf("%s-%s-%d", lwsName, key, number)
}

// ApplyRevision returns a copy of lws with the template and network config kept in rev.
func ApplyRevision(lws *v1alpha1.LeaderWorkerSet, rev *appsv1.ControllerRevision) (*v1alpha1.LeaderWorkerSet, error) {
	var d revisionData
	if err := json.Unmarshal(rev.Data.Raw, &d); err != nil {
		return nil, fmt.Errorf("ControllerRevision %s: %w", rev.Name, err)
	}
	out := lws.DeepCopy()
	out.Spec.LeaderWorkerTemplate = d.Spec.LeaderWorkerTemplate
	out.Spec.NetworkConfig = d.Spec.NetworkConfig
	for key, v := range map[string]string{
		v1alpha1.ExclusiveKeyAnnotationKey:         d.Spec.ExclusiveTopology,
		v1alpha1.SubGroupExclusiveKeyAnnotationKey: d.Spec.SubGroupExclusiveTopology,
	} {
		if v == "" {
			delete(out.Annotations, key)
			continue
		}
		if out.Annotations == nil {
			out.Annotations = map[string]string{}
		}
		out.Annotations[key] = v
	}
	return out, nil
}

// listRevisions lists, from the cache, the ControllerRevisions lws controls.
func listRevisions(ctx context.Context, c client.Reader, lws *v1alpha1.LeaderWorkerSet) ([]*appsv1.ControllerRevision, error) {
	var list appsv1.ControllerRevisionList
	if err := c.List(ctx, &list, client.InNamespace(lws.Namespace), client.MatchingLabels{v1alpha1.SetNameLabelKey: lws.Name}); err != nil {
		return nil, err
	}
	var out []*appsv1.ControllerRevision
	for i := range list.Items {
		if metav1.IsControlledBy(&list.Items[i], lws) {
			out = append(out, &list.Items[i])
		}
	}
	return out, nil
}

// latestRevision returns the highest-numbered of revs with the given key (any key when key is
// empty), or nil.
func latestRevision(revs []*appsv1.ControllerRevision, key string) *appsv1.ControllerRevision {
	var latest *appsv1.ControllerRevision
	for _, r := range revs {
		if (key == "" || r.Labels[v1alpha1.RevisionKey] == key) && (latest == nil || r.Revision > latest.Revision) {
			latest = r
		}
	}
	return latest
}

// ensureRevision creates the ControllerRevision of template revision key unless it exists.
// desired is the defaulted LeaderWorkerSet the key was computed from.
func ensureRevision(ctx context.Context, c client.Client, desired *v1alpha1.LeaderWorkerSet, key string) error {
	revs, err := listRevisions(ctx, c, desired)
	if err != nil || latestRevision(revs, key) != nil {
		return err
	}
	number := int64(1)
	if last := latestRevision(revs, ""); last != nil {
		number = last.Revision + 1
	}
	kind, err := c.GroupVersionKindFor(desired)
	if err != nil {
		return err
	}
	rev, err := NewRevision(desired, kind, key, number)
	if err != nil {
		return err
	}
	err = c.Create(ctx, rev)
	if apierrors.IsAlreadyExists(err) {
		// Created by an earlier pass the cache has not caught up with: names are deterministic.
		return nil
	}
	if err == nil {
		klog.FromContext(ctx).V(2).Info("created template revision", "controllerRevision", klog.KObj(rev))
	}
	return err
}

// truncateRevisions deletes every revision of lws but key's; called once no group uses them.
func truncateRevisions(ctx context.Context, c client.Client, lws *v1alpha1.LeaderWorkerSet, key string) error {
	revs, err := listRevisions(ctx, c, lws)
	if err != nil {
		return err
	}
	for _, r := range revs {
		if r.Labels[v1alpha1.RevisionKey] == key {
			continue
		}
		if err := c.Delete(ctx, r, client.Preconditions{UID: &r.UID}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		klog.FromContext(ctx).V(2).Info("deleted template revision", "controllerRevision", klog.KObj(r))
	}
	return nil
}

// groupTemplate returns lws as it was at template revision key, for building the workers of a
// group whose leader carries that revision. It is nil when the revision is not in the cache (yet).
func groupTemplate(ctx context.Context, c client.Reader, lws *v1alpha1.LeaderWorkerSet, key string) (*v1alpha1.LeaderWorkerSet, error) {
	if key == "" || key == TemplateHash(lws) {
		return lws, nil
	}
	revs, err := listRevisions(ctx, c, lws)
	if err != nil {
		return nil, err
	}
	rev := latestRevision(revs, key)
	if rev == nil {
		return nil, nil
	}
	return ApplyRevision(lws, rev)
}

// CacheByObject narrows the manager's cache to what this package reads of shared kinds: only the
// ControllerRevisions of LeaderWorkerSets, not those of every StatefulSet and DaemonSet.
func CacheByObject() map[client.Object]cache.ByObject {
	ours, err := labels.NewRequirement(v1alpha1.SetNameLabelKey, selection.Exists, nil)
	if err != nil {
		panic(err) // a constant, valid key
	}
	return map[client.Object]cache.ByObject{
		&appsv1.ControllerRevision{}: {Label: labels.NewSelector().Add(*ours)},
	}
}
