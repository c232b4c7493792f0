package ids

import (
	"strings"
	"testing"
)

func TestSnapshotIDNamesItsNode(t *testing.T) {
	for _, tc := range []struct {
		name, pool, node, want string
	}{
		{"node", "fast", "node-1", "node-1"},
		{"node with dots", "fast-nvme", "ip-10-0-0-1.ec2.internal", "ip-10-0-0-1.ec2.internal"},
		{"no node", "fast", "", ""},
		{"node too long for a 128-byte ID", "fast", strings.Repeat("n", 100), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := NewSnapshotID(tc.pool, tc.node)
			if len(id) > 128 {
				t.Fatalf("ID %q is longer than 128 bytes", id)
			}
			if got := NodeOfSnapshotID(id); got != tc.want {
				t.Fatalf("NodeOfSnapshotID(%q) = %q, want %q", id, got, tc.want)
			}
		})
	}
	for _, id := range []string{"", "_node-1", "fast-snap-1_node-1", "fast-" + RandomHex() + "_node-1", "csi-sanity-snap_node"} {
		if got := NodeOfSnapshotID(id); got != "" {
			t.Errorf("NodeOfSnapshotID(%q) = %q, want none", id, got)
		}
	}
}
