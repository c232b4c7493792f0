package driver

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cistern-csi/cistern/pkg/image"
	"github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/pool"
	"github.com/cistern-csi/cistern/pkg/state"
)

const (
	idHexLen       = 32
	snapshotMarker = "-snap-"
)

// newVolumeID makes `<pool>-<32 hex>`: the pool is part of the ID so that any instance of the
// driver that has the pool (a node plugin without the controller's state, a shared pool) can
// find the image from the ID alone.
func newVolumeID(poolName string) string { return poolName + "-" + randomHex() }

// newSnapshotID makes `<pool>-snap-<32 hex>`.
func newSnapshotID(poolName string) string { return poolName + snapshotMarker + randomHex() }

func randomHex() string {
	b := make([]byte, idHexLen/2)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b)
}

// poolOfVolumeID returns the pool encoded in a volume ID, or "" for a foreign ID.
func poolOfVolumeID(id string) string {
	return poolOfID(id, "-")
}

// poolOfSnapshotID returns the pool encoded in a snapshot ID, or "" for a foreign ID.
func poolOfSnapshotID(id string) string {
	return poolOfID(id, snapshotMarker)
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

// poolPath returns the path of a configured pool, or FailedPrecondition when it is gone from
// the config (its volumes cannot be reached until it comes back).
func (d *Driver) poolPath(name string) (string, error) {
	p, ok := d.pools.Get(name)
	if !ok {
		return "", status.Errorf(codes.FailedPrecondition, "pool %q is not configured on node %s", name, d.cfg.NodeID)
	}
	return p.Path, nil
}

// volumeImage returns the image path of a volume.
func (d *Driver) volumeImage(v state.Volume) (string, error) {
	path, err := d.poolPath(v.Pool)
	if err != nil {
		return "", err
	}
	return image.VolumePath(path, pool.MetaDir, v.ID), nil
}

// lookupVolume finds a volume by ID. A node plugin that did not create the volume (separate
// controller and node instances over a shared pool) adopts it from its image.
func (d *Driver) lookupVolume(id string) (state.Volume, error) {
	if v, ok := d.store.GetVolume(id); ok {
		if !v.Ready {
			return state.Volume{}, status.Errorf(codes.Aborted, "volume %s is still being created", id)
		}
		return v, nil
	}
	poolName := poolOfVolumeID(id)
	if poolName == "" {
		return state.Volume{}, status.Errorf(codes.NotFound, "volume %s does not exist", id)
	}
	path, err := d.poolPath(poolName)
	if err != nil {
		return state.Volume{}, status.Errorf(codes.NotFound, "volume %s does not exist: %v", id, err)
	}
	img := image.VolumePath(path, pool.MetaDir, id)
	size, err := d.images.Size(img)
	if err != nil {
		return state.Volume{}, status.Errorf(codes.NotFound, "volume %s does not exist", id)
	}
	// Unknown history: Formatted makes staging probe the device before any mkfs.
	return state.Volume{ID: id, Pool: poolName, CapacityBytes: size, Ready: true, Formatted: true, NeedsGrow: true}, nil
}

// selectPool picks the pool for a new volume. No room, or no allowed pool on this node, is
// ResourceExhausted so that external-provisioner retries or tries another node.
func (d *Driver) selectPool(pl params.Volume, size int64) (pool.Status, error) {
	pools, _ := d.pools.List()
	chosen, err := pool.Select(pools, pool.Request{Name: pl.Pool, Selector: pl.PoolSelector, RequiredBytes: size})
	if err != nil {
		var noRoom *pool.NoRoomError
		if errors.As(err, &noRoom) {
			return pool.Status{}, status.Errorf(codes.ResourceExhausted, "node %s: %v", d.cfg.NodeID, err)
		}
		return pool.Status{}, internal("selecting a pool", err)
	}
	return chosen, nil
}

// imageError maps a failed image operation: a full pool is ResourceExhausted, anything else
// Internal.
func (d *Driver) imageError(what, poolName string, err error) error {
	if errors.Is(err, unix.ENOSPC) {
		return status.Errorf(codes.ResourceExhausted, "%s: pool %q on node %s: %v", what, poolName, d.cfg.NodeID, err)
	}
	return internal(what, err)
}

func internal(what string, err error) error {
	return status.Errorf(codes.Internal, "%s: %v", what, err)
}

func errorf(c codes.Code, format string, args ...any) error {
	return status.Error(c, fmt.Sprintf(format, args...))
}
