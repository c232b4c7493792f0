package datasource

import (
	"fmt"
	"path/filepath"
	"sync"

	"github.com/go-logr/logr"

	"github.com/cistern-csi/cistern/pkg/datasource/cache"
)

// startStaging starts the caller's own staging of what it sees in dir, with the pool lock pl
// held (released here): the dataset's own directory when no ready version served it and no
// staging of the dataset runs, or a directory beside it (cache.Beside) when other versions are
// being staged (startBeside).
func (m *Manager) startStaging(logger logr.Logger, req Request, pl sync.Locker, key, who, dir string) (Status, *staging, error) {
	id := req.Spec.ID()
	src, err := m.openSource(req)
	if err != nil {
		pl.Unlock()
		return Status{}, nil, fmt.Errorf("%s: %w", req.Spec.Describe(), err)
	}
	m.mu.Lock()
	under := len(m.jobs[key])
	m.mu.Unlock()
	// The stagings are versions too: the kept ones leave them room under the limit.
	if err := m.cache.TrimLocked(req.Pool, id, m.limits.MaxVersions-1-under); err != nil {
		pl.Unlock()
		src.Close()
		return Status{}, nil, fmt.Errorf("%s: %w", req.Spec.Describe(), err)
	}
	acc := &callerAccess{m: m, req: req, who: who}
	j := &staging{Job: m.engine.New(req.Spec, req.Capacity, req.Pool, dir, src, acc), principal: who, done: make(chan struct{}),
		beside: dir != cache.DatasetDir(req.Pool, id)}
	m.mu.Lock()
	m.jobs[key] = append(m.jobs[key], j)
	delete(m.lastFail, key)
	m.mu.Unlock()
	j.unpin = m.cache.PinStaging(req.Pool, filepath.Base(dir))
	pl.Unlock()
	m.cache.Changed()
	logger.Info("staging dataset", "credentials", req.Creds.String(), "beside", j.beside)
	go m.runJob(logger, key, j)
	return j.Status(), j, nil
}
