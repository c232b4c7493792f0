// Package ids makes and reads Cistern's volume and snapshot IDs. It is part of the small contract
// every binary shares (with pkg/consts): the workload-controller reads the node out of snapshot
// IDs without linking the driver's volume engine.
package ids

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
)

const (
	idHexLen       = 32
	snapshotMarker = "-snap-"
	// nodeMarker separates a snapshot ID from the node that holds it. Neither pool names (DNS
	// labels) nor node names (DNS subdomains) contain it.
	nodeMarker = "_"
	// maxIDLen is the longest ID CSI allows a plugin to return.
	maxIDLen = 128
)

// NewVolumeID makes `<pool>-<32 hex>`: the pool is part of the ID so that any instance of the
// driver that has the pool (a node plugin without the controller's state, a shared pool) can
// find the image from the ID alone.
func NewVolumeID(poolName string) string { return poolName + "-" + RandomHex() }

// NewSnapshotID makes `<pool>-snap-<32 hex>_<node>`. A snapshot lives on the node that took it
// (its copy is in that node's pool), so a node asked to restore a snapshot it does not hold must
// tell "on another node" (ResourceExhausted: provision elsewhere) from "no such snapshot"
// (NotFound), and whatever labels a hand-made VolumeSnapshotContent for its node's
// csi-snapshotter needs the node too: both read it from the ID (NodeOfSnapshotID). A node name
// too long for a 128-byte ID is left out; such a snapshot is then NotFound on other nodes.
func NewSnapshotID(poolName, node string) string {
	id := poolName + snapshotMarker + RandomHex()
	if node != "" && len(id)+len(nodeMarker)+len(node) <= maxIDLen && !strings.Contains(node, nodeMarker) {
		id += nodeMarker + node
	}
	return id
}

// NodeOfSnapshotID returns the node named in a snapshot ID made by NewSnapshotID, or "" for an
// ID that names none (an older or foreign ID).
func NodeOfSnapshotID(id string) string {
	i := strings.LastIndex(id, nodeMarker)
	if i < 0 || poolOfID(id[:i], snapshotMarker) == "" {
		return ""
	}
	return id[i+len(nodeMarker):]
}

// RandomHex returns 32 random hex digits.
func RandomHex() string {
	b := make([]byte, idHexLen/2)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b)
}

// PoolOfVolumeID returns the pool encoded in a volume ID, or "" for a foreign ID.
func PoolOfVolumeID(id string) string {
	return poolOfID(id, "-")
}

func poolOfID(id, sep string) string {
	n := len(id) - idHexLen
	if n <= len(sep) || id[n-len(sep):n] != sep {
		return ""
	}
	if _, err := hex.DecodeString(id[n:]); err != nil || strings.ToLower(id[n:]) != id[n:] {
		return ""
	}
	return id[:n-len(sep)]
}
