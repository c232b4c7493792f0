package upstreamdiff_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cistern-csi/cistern/test/framework"
)

// compared are the kinds a LeaderWorkerSet leads to, and itself (defaulting and status).
var compared = []schema.GroupVersionKind{
	lwsGVK,
	{Group: "apps", Version: "v1", Kind: "StatefulSet"},
	{Group: "apps", Version: "v1", Kind: "ControllerRevision"},
	{Version: "v1", Kind: "Service"},
	{Version: "v1", Kind: "Pod"},
	{Version: "v1", Kind: "PersistentVolumeClaim"},
}

// volatile are fields that differ between any two runs of the same controller: identities,
// times, what the scheduler and the fake kubelet chose.
var volatile = []*regexp.Regexp{
	regexp.MustCompile(`\.metadata\.(uid|resourceVersion|creationTimestamp|managedFields|generation|deletionGracePeriodSeconds)(\.|\[|$)`),
	regexp.MustCompile(`\.metadata\.ownerReferences\[\d+\]\.uid$`),
	regexp.MustCompile(`(lastTransitionTime|lastProbeTime|lastUpdateTime|startTime|startedAt)$`),
	regexp.MustCompile(`^Pod/[^.]+\.spec\.nodeName$`),
	regexp.MustCompile(`^Pod/[^.]+\.status\.(hostIP|hostIPs|podIP|podIPs|qosClass)`),
	regexp.MustCompile(`^Service/[^.]+\.spec\.(clusterIP|clusterIPs)(\[|$)`),
	regexp.MustCompile(`^PersistentVolumeClaim/[^.]+\.metadata\.annotations\.volume\.`),
}

// knownDifferences are the differences from upstream that remain, each with its reason
// (docs/workloads.md, Differences from upstream). A difference whose path matches none fails the
// test.
var knownDifferences = []struct {
	path   *regexp.Regexp
	reason string
}{
	{regexp.MustCompile(`leaderworkerset\.sigs\.k8s\.io/template-revision-hash$|\.metadata\.labels\.controller-revision-hash$|` +
		`^StatefulSet/[^.]+\.status\.(currentRevision|updateRevision)$|^ControllerRevision/`),
		"the template revision hash: Cistern's is a SHA-256 of its own template encoding (which covers the exclusive-placement " +
			"annotations and the claim retention policy), upstream's an FNV-32 of a strategic-merge patch; so the revision-named " +
			"objects (ControllerRevisions, the StatefulSets' revisions) differ by name"},
	{regexp.MustCompile(`^LeaderWorkerSet/[^.]+\.spec\.leaderWorkerTemplate\.persistentVolumeClaimRetentionPolicy\.`),
		"Cistern's CRD defaults persistentVolumeClaimRetentionPolicy to Retain/Retain (what the StatefulSets get from upstream too)"},
	{regexp.MustCompile(`^LeaderWorkerSet/[^.]+\.status\.(observedGeneration|conditions\[\d+\]\.(observedGeneration|message))$`),
		"Cistern writes status.observedGeneration and each condition's observedGeneration, and its own condition messages (counts of groups)"},
	{regexp.MustCompile(`^StatefulSet/[^.]+\.metadata\.annotations\.(workloads\.cistern\.dev/spec-hash|leaderworkerset\.sigs\.k8s\.io/(subgroup-)?exclusive-topology)$`),
		"Cistern annotates the StatefulSets it builds with the hash of their spec (it writes only when it changed) and the placement annotations it built them with"},
	{regexp.MustCompile(`^StatefulSet/[^.]+\.spec\.updateStrategy\.rollingUpdate\.maxUnavailable$`),
		"the leader StatefulSet's own maxUnavailable: upstream copies the LeaderWorkerSet's; Cistern sets maxUnavailable+maxSurge, " +
			"since its partition is what keeps an update within the budget (docs/workloads.md, Rolling update)"},
	{regexp.MustCompile(`^(Pod/[^.]+\.metadata|StatefulSet/[^.]+\.spec\.template\.metadata)\.annotations\.leaderworkerset\.sigs\.k8s\.io/subgroup-policy-type$`),
		"Cistern puts the subgroup policy type on the workers too (upstream only on leaders, the only pods whose labels it changes); " +
			"taking it off would change the worker StatefulSets' template and roll the workers of every existing group with subgroups"},
	{regexp.MustCompile(`^StatefulSet/[^.]+\.spec\.volumeClaimTemplates\[\d+\]\.metadata\.namespace$`),
		"upstream writes the namespace into the StatefulSets' claim templates, Cistern does not (the StatefulSet controller " +
			"ignores it); claim templates of an existing StatefulSet cannot be changed"},
}

// accessToken is the name of the token volume the API server adds to each pod; its suffix is
// random.
var accessToken = regexp.MustCompile(`kube-api-access-[a-z0-9]{5}`)

// snapshot returns every compared object in ns, flattened: "<Kind>/<name>.<path>" -> JSON value.
func snapshot(ctx context.Context, s *side, ns string) (map[string]string, error) {
	out := map[string]string{}
	for _, gvk := range compared {
		var list unstructured.UnstructuredList
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := s.cl.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return nil, fmt.Errorf("%s: listing %s: %w", s.name, gvk.Kind, err)
		}
		for _, o := range list.Items {
			if gvk.Kind == "ControllerRevision" && !ownedByLWS(o) {
				continue // a StatefulSet's: its name is a hash of the template compared already
			}
			flatten(gvk.Kind+"/"+o.GetName(), o.Object, out)
		}
	}
	for k := range out {
		if slices.ContainsFunc(volatile, func(re *regexp.Regexp) bool { return re.MatchString(k) }) {
			delete(out, k)
		}
		// Exclusive placement pins the workers to the domain the scheduler chose for their
		// leader: that the selector is there is compared, not which pool it names.
		if strings.HasSuffix(k, ".spec.nodeSelector."+nodePool) {
			out[k] = "(the leader's " + nodePool + ")"
		}
	}
	return out, nil
}

func ownedByLWS(o unstructured.Unstructured) bool {
	for _, r := range o.GetOwnerReferences() {
		if r.Kind == "LeaderWorkerSet" {
			return true
		}
	}
	return false
}

// flatten writes v's leaves (and empty maps and lists) under prefix.
func flatten(prefix string, v any, out map[string]string) {
	switch v := v.(type) {
	case map[string]any:
		if len(v) == 0 {
			out[prefix] = "{}"
		}
		for k, e := range v {
			flatten(prefix+"."+k, e, out)
		}
	case []any:
		if len(v) == 0 {
			out[prefix] = "[]"
		}
		for i, e := range v {
			flatten(fmt.Sprintf("%s[%d]", prefix, i), e, out)
		}
	default:
		b, _ := json.Marshal(v)
		out[accessToken.ReplaceAllString(prefix, "kube-api-access-*")] = accessToken.ReplaceAllString(string(b), "kube-api-access-*")
	}
}

// difference is one field that is not the same on both sides ("" where a side lacks it).
type difference struct{ path, upstream, cistern string }

func (d difference) String() string {
	return fmt.Sprintf("%s: upstream %s, cistern %s", d.path, orAbsent(d.upstream), orAbsent(d.cistern))
}

func orAbsent(s string) string {
	if s == "" {
		return "(absent)"
	}
	return s
}

// diff returns the differences of two snapshots, sorted, and how many fields the two hold.
func diff(up, cis map[string]string) ([]difference, int) {
	keys := map[string]bool{}
	for k := range up {
		keys[k] = true
	}
	for k := range cis {
		keys[k] = true
	}
	var out []difference
	for k := range keys {
		if up[k] != cis[k] {
			out = append(out, difference{k, up[k], cis[k]})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].path < out[j].path })
	return out, len(keys)
}

// explain splits differences into those knownDifferences explains (by reason) and the others.
func explain(ds []difference) (known map[string][]difference, unknown []difference) {
	known = map[string][]difference{}
	for _, d := range ds {
		i := slices.IndexFunc(knownDifferences, func(k struct {
			path   *regexp.Regexp
			reason string
		}) bool {
			return k.path.MatchString(d.path)
		})
		if i < 0 {
			unknown = append(unknown, d)
			continue
		}
		known[knownDifferences[i].reason] = append(known[knownDifferences[i].reason], d)
	}
	return known, unknown
}

// compareSides compares what the two sides made in ns until only known differences remain (status
// catches up a moment after the pods), or for a minute; it reports what it found and returns how
// many fields it compared.
func compareSides(t *testing.T, ctx context.Context, up, cis *side, ns string) int {
	t.Helper()
	var (
		known   map[string][]difference
		unknown []difference
		fields  int
	)
	for deadline := time.Now().Add(time.Minute); ; {
		a, err := snapshot(ctx, up, ns)
		if err != nil {
			t.Fatal(err)
		}
		b, err := snapshot(ctx, cis, ns)
		if err != nil {
			t.Fatal(err)
		}
		var ds []difference
		ds, fields = diff(a, b)
		known, unknown = explain(ds)
		if len(unknown) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	for reason, ds := range known {
		t.Logf("%d known difference(s), %s; first: %s", len(ds), reason, ds[0])
	}
	if len(unknown) > 0 {
		var all strings.Builder
		for _, d := range unknown {
			all.WriteString(d.String() + "\n")
		}
		file := filepath.Join(framework.LogDir(t), "differences.txt")
		if err := os.WriteFile(file, []byte(all.String()), 0o644); err != nil {
			t.Error(err)
		}
		t.Errorf("%d unexplained difference(s) of %d fields (all in %s), by field:%s", len(unknown), fields, file, byField(unknown))
	}
	return fields
}

// numbers are the indexes and names that make one field many paths.
var numbers = regexp.MustCompile(`\[\d+\]`)

// byField counts differences per field (kind, path without object names or indexes), with one
// example each.
func byField(ds []difference) string {
	count, example := map[string]int{}, map[string]difference{}
	for _, d := range ds {
		kind, rest, _ := strings.Cut(d.path, "/")
		_, path, _ := strings.Cut(rest, ".")
		k := kind + " " + numbers.ReplaceAllString(path, "[]")
		if count[k] == 0 {
			example[k] = d
		}
		count[k]++
	}
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(count)) {
		fmt.Fprintf(&b, "\n%4d %s; e.g. %s", count[k], k, example[k])
	}
	return b.String()
}
