package chaos

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/cistern-csi/cistern/test/testpeers"
)

// loadFaults faults the first GET of every object of the load's datasets, one transient fault
// after another, each counted by the proxy under "load/<dataset>".
type loadFaults struct {
	seen map[string]bool
	next int
}

func (l *loadFaults) choose(path string) testpeers.Fault {
	if l.seen[path] {
		return testpeers.None
	}
	l.seen[path] = true
	cut := int64(1 + l.next*977%4096) // below minFile: always body left to cut
	kinds := []testpeers.Fault{
		{Status: http.StatusServiceUnavailable, Code: "SlowDown", ResetAfter: -1},
		{Status: http.StatusInternalServerError, Code: "InternalError", ResetAfter: -1},
		{ResetAfter: cut},
		{ResetAfter: cut, Truncate: true},
		{ResetAfter: -1, Flip: true},
	}
	f := kinds[l.next%len(kinds)]
	l.next++
	f.Name = "load/" + datasetOf(path)
	return f
}

// datasetOf is the dataset (the prefix below the bucket) of an object's path-style URL path.
func datasetOf(path string) string {
	parts := strings.SplitN(strings.TrimPrefix(path, "/"), "/", 3)
	if len(parts) < 2 {
		return ""
	}
	return parts[1]
}

// runLoad publishes n read-only inline volumes over `datasets` datasets at once on the node, as n
// pods starting together would, with the first GET of every object faulted; it times each from
// its first call to its success and checks it byte for byte. Every dataset must have had a fault
// delivered, and every volume must come up right: problems says what did not.
func (s *suite) runLoad(n, datasets int) (line string, problems []string) {
	if n == 0 {
		return "load: volumes=0", nil
	}
	datasets = max(1, min(datasets, n))
	want := make([]map[string][]byte, datasets)
	for d := range datasets {
		want[d] = s.dataset(fmt.Sprintf("load-%d", d), 6, 512<<10)
	}
	s.mu.Lock()
	s.load = &loadFaults{seen: map[string]bool{}}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.load = nil
		s.mu.Unlock()
	}()
	durations := make([]float64, n)
	var errs atomic.Int64
	var mu sync.Mutex
	problem := func(format string, args ...any) {
		mu.Lock()
		problems = append(problems, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() {
			id := fmt.Sprintf("chaos-load-%d", k)
			target := filepath.Join(s.n.dir, "pods", id, "volume")
			vc := s.inlineContext(fmt.Sprintf("load-%d", k%datasets))
			start := time.Now()
			err := retry(5*time.Minute, func(ctx context.Context) error {
				_, err := s.n.nodeC().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
					VolumeCapability: mountCap(), VolumeContext: vc, Readonly: true, Secrets: s.secrets})
				return err
			})
			durations[k] = time.Since(start).Seconds()
			if err != nil {
				errs.Add(1)
				problem("load volume %d: %v", k, err)
				return
			}
			if d := compare(target, want[k%datasets]); d != "" {
				errs.Add(1)
				problem("load volume %d: %s", k, d)
			}
		})
	}
	wg.Wait()
	for k := range n {
		id := fmt.Sprintf("chaos-load-%d", k)
		target := filepath.Join(s.n.dir, "pods", id, "volume")
		if err := retry(time.Minute, func(ctx context.Context) error {
			_, err := s.n.nodeC().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
			return err
		}); err != nil {
			errs.Add(1)
			problem("unpublish load volume %d: %v", k, err)
		}
	}
	if l := s.settledLeaks(); len(l) > 0 {
		problem("load: leaked %v", l)
	}
	delivered := 0
	for d := range datasets {
		got := s.proxy.Delivered(fmt.Sprintf("load/load-%d", d))
		if got == 0 {
			problem("load: no fault was delivered while dataset load-%d was staged", d)
		}
		delivered += got
	}
	sort.Float64s(durations)
	q := func(p float64) float64 { return durations[int(p*float64(n-1)+0.5)] }
	return fmt.Sprintf("load: volumes=%d datasets=%d faults_delivered=%d p50_s=%.2f p99_s=%.2f errors=%d",
		n, datasets, delivered, q(0.5), q(0.99), errs.Load()), problems
}
