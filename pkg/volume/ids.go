package volume

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
)

const (
	idHexLen       = 32
	snapshotMarker = "-snap-"
)

// NewVolumeID makes `<pool>-<32 hex>`: the pool is part of the ID so that any instance of the
// driver that has the pool (a node plugin without the controller's state, a shared pool) can
// find the image from the ID alone.
func NewVolumeID(poolName string) string { return poolName + "-" + RandomHex() }

// NewSnapshotID makes `<pool>-snap-<32 hex>`.
func NewSnapshotID(poolName string) string { return poolName + snapshotMarker + RandomHex() }

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
