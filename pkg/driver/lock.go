package driver

import (
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// keyLocks serialises operations per volume (or snapshot, or name) without a global lock: a
// slow operation on one volume never blocks another. A second operation on a busy key fails
// at once with Aborted, which the CO retries with backoff.
type keyLocks struct {
	mu   sync.Mutex
	busy map[string]struct{}
}

func newKeyLocks() *keyLocks { return &keyLocks{busy: map[string]struct{}{}} }

// acquire locks every key or none, and returns the release function.
func (l *keyLocks) acquire(keys ...string) (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		if _, ok := l.busy[k]; ok {
			return nil, status.Errorf(codes.Aborted, "an operation on %s is already in progress", k)
		}
	}
	for _, k := range keys {
		l.busy[k] = struct{}{}
	}
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, k := range keys {
			delete(l.busy, k)
		}
	}, nil
}

func volumeKey(id string) string      { return "volume " + id }
func volumeNameKey(n string) string   { return "volume name " + n }
func snapshotKey(id string) string    { return "snapshot " + id }
func snapshotNameKey(n string) string { return "snapshot name " + n }
