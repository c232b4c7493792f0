package poolpublisher

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestObjectName(t *testing.T) {
	long := strings.Repeat("n", 250)
	tests := []struct {
		name   string
		pool   string
		node   string
		shared bool
		want   string
	}{
		{name: "node-local pool", pool: "fast", node: "node-1", want: "fast.node-1"},
		{name: "same pool name on another node", pool: "fast", node: "node-2", want: "fast.node-2"},
		{name: "node name with dots", pool: "fast", node: "ip-10-0-0-1.ec2.internal", want: "fast.ip-10-0-0-1.ec2.internal"},
		{name: "shared pool is named after the pool alone", pool: "nfs", node: "", shared: true, want: "nfs"},
		{name: "shared pool ignores the node", pool: "nfs", node: "node-1", shared: true, want: "nfs"},
		{name: "invalid pool name gets a hash", pool: "Fast_Pool", node: "node-1"},
		{name: "pool name with a dot gets a hash", pool: "a.b", node: "c"},
		{name: "too long gets a hash", pool: "fast", node: long},
		{name: "invalid shared pool name gets a hash", pool: "NFS", shared: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ObjectName(tc.pool, tc.node, tc.shared)
			if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
				t.Fatalf("ObjectName(%q, %q) = %q, not a valid object name: %v", tc.pool, tc.node, got, errs)
			}
			if tc.want != "" && got != tc.want {
				t.Errorf("ObjectName(%q, %q, %v) = %q, want %q", tc.pool, tc.node, tc.shared, got, tc.want)
			}
			if tc.want == "" && len(got) < hashLen+1 {
				t.Errorf("ObjectName(%q, %q) = %q, want a hashed name", tc.pool, tc.node, got)
			}
		})
	}
}

func TestObjectNameUnique(t *testing.T) {
	inputs := []struct {
		pool, node string
		shared     bool
	}{
		{"fast", "node-1", false}, {"fast", "node-2", false}, {"fast", "", true},
		{"fast.node-1", "", true}, {"a", "b.c", false}, {"a.b", "c", false},
		{"Fast", "node-1", false}, {"fast_", "node-1", false}, {"FAST", "node-1", false},
		{"fast", strings.Repeat("x", 250), false}, {"fast", strings.Repeat("x", 251), false},
		{"node-1", "fast", false}, {"fast-node-1", "", true},
	}
	seen := map[string]int{}
	for i, in := range inputs {
		n := ObjectName(in.pool, in.node, in.shared)
		if j, ok := seen[n]; ok {
			t.Errorf("inputs %d %+v and %d %+v both map to %q", j, inputs[j], i, in, n)
		}
		seen[n] = i
	}
}

func TestLabelValue(t *testing.T) {
	for _, v := range []string{"node-1", "ip-10-0-0-1.ec2.internal", strings.Repeat("a", 63), strings.Repeat("a", 64),
		"UPPER_and spaces!", "-leading", strings.Repeat("b.", 100), "é"} {
		got := LabelValue(v)
		if errs := validation.IsValidLabelValue(got); len(errs) > 0 {
			t.Errorf("LabelValue(%q) = %q, invalid: %v", v, got, errs)
		}
		if len(validation.IsValidLabelValue(v)) == 0 && got != v {
			t.Errorf("LabelValue(%q) = %q, want it unchanged", v, got)
		}
	}
	if LabelValue(strings.Repeat("a", 64)) == LabelValue(strings.Repeat("a", 65)) {
		t.Error("two long values map to the same label value")
	}
}
