package datasource

import (
	"fmt"
	"sync"

	"github.com/go-logr/logr"

	"github.com/cistern-csi/cistern/pkg/datasource/cache"
)

// startStaging starts the caller's own staging of what it sees, with the pool lock pl held
// (released here): no ready version served it and no staging of the dataset runs.
func (m *Manager) startStaging(logger logr.Logger, req Request, pl sync.Locker, key, who string) (Status, *staging, error) {
	id := req.Spec.ID()
	dir := cache.DatasetDir(req.Pool, id)
	src, err := m.openSource(req)
	if err != nil {
		pl.Unlock()
		return Status{}, nil, fmt.Errorf("%s: %w", req.Spec.Describe(), err)
	}
	// The staging is a version too: the kept ones leave it room under the limit.
	if err := m.cache.TrimLocked(req.Pool, id, m.limits.MaxVersions-1); err != nil {
		pl.Unlock()
		src.Close()
		return Status{}, nil, fmt.Errorf("%s: %w", req.Spec.Describe(), err)
	}
	acc := &callerAccess{m: m, req: req, who: who}
	j := &staging{Job: m.engine.New(req.Spec, req.Capacity, req.Pool, dir, src, acc), principal: who, done: make(chan struct{})}
	m.mu.Lock()
	m.jobs[key] = j
	delete(m.lastFail, key)
	m.mu.Unlock()
	j.unpin = m.cache.PinStaging(req.Pool, id)
	pl.Unlock()
	m.cache.Changed()
	logger.Info("staging dataset", "credentials", req.Creds.String())
	go m.runJob(logger, key, j)
	return j.Status(), j, nil
}
