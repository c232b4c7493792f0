package datasource_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// Listing floods (issue 24, item 3): a pod author names a bucket and patterns that make the node
// list and match without bound while keeping nothing.

// TestListingCountsEverything: every listed key counts against --max-dataset-objects, those the
// include filter drops too, and so does every common prefix the walk goes through; glob matching
// is bounded by --max-dataset-glob-work. Each dataset here keeps at most one entry.
func TestListingCountsEverything(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "flood")
	for i := range 30 {
		s.Put(t, "flood", fmt.Sprintf("flat/k%02d", i), []byte("x"))
		s.Put(t, "flood", fmt.Sprintf("dirs/d%02d/k", i), []byte("x"))
	}
	s.Put(t, "flood", "flat/keep.json", []byte("{}"))
	for _, tc := range []struct {
		name, prefix, include string
		limits                datasource.Limits
		code                  codes.Code
		want                  string
	}{
		// 31 keys listed, 1 kept (S3 counts what it lists; the engine counts what every source lists).
		{"keys the include filter drops", "flat", "*.json", datasource.Limits{MaxObjects: 20}, codes.OutOfRange, "more than 20"},
		// 30 keys and 30 common prefixes: 60 listed, none kept.
		{"common prefixes", "dirs", "*.json", datasource.Limits{MaxObjects: 45}, codes.OutOfRange, "common prefix"},
		// 31 keys, each matched against a pattern: far more than 500 units.
		{"glob work", "flat", "**/*.json", datasource.Limits{MaxGlobWork: 500}, codes.OutOfRange, "units of work"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newManager(t, datasource.Config{Limits: tc.limits})
			p := s3Params(s, "", "s3://flood/"+tc.prefix)
			p["include"] = tc.include
			spec := mustSpec(t, p)
			_, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: t.TempDir()})
			if datasource.Code(err) != tc.code || !strings.Contains(fmt.Sprint(err), tc.want) {
				t.Fatalf("got %v (%v), want %v naming %q", datasource.Code(err), err, tc.code, tc.want)
			}
		})
	}
}

// TestListingsBounded: many datasets of one endpoint staged at once list at most
// --max-concurrent-listings-per-source at a time; the rest wait their turn and then succeed.
func TestListingsBounded(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "many")
	const datasets = 6
	for d := range datasets {
		s.Put(t, "many", fmt.Sprintf("set%d/f", d), []byte("x"))
	}
	var mu sync.Mutex
	inFlight, most := map[string]int{}, 0
	proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if r.URL.Query().Get("list-type") == "" {
			return testpeers.None
		}
		set, _, _ := strings.Cut(r.URL.Query().Get("prefix"), "/")
		mu.Lock()
		inFlight[set]++
		most = max(most, len(inFlight))
		mu.Unlock()
		time.Sleep(200 * time.Millisecond) // each listing is held a while, and counted while it is
		mu.Lock()
		if inFlight[set]--; inFlight[set] == 0 {
			delete(inFlight, set)
		}
		mu.Unlock()
		return testpeers.None
	})
	m := newManager(t, datasource.Config{Limits: datasource.Limits{ListingsPerSource: 2}})
	pool := t.TempDir()
	var wg sync.WaitGroup
	for d := range datasets {
		wg.Go(func() {
			spec := mustSpec(t, s3Params(s, proxy.URL, fmt.Sprintf("s3://many/set%d", d)))
			if _, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}); err != nil {
				t.Errorf("set%d: %v", d, err)
			}
		})
	}
	wg.Wait()
	if most == 0 || most > 2 {
		t.Fatalf("%d datasets listed at once, want 1 or 2", most)
	}
}
