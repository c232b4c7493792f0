package datasource_test

import (
	"context"
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

// Listing slots (issue 37, item 5): one endpoint written many ways, one namespace's many
// listings, and a server that never quite answers must each leave the node's other listings
// their slots.

// listingsInFlight counts, at a proxy, the datasets (the first segment of a listing's prefix)
// whose listings are under way, and the most at once of those whose names start with each of
// the groups; hold, while set, keeps every listing of a group waiting until release.
type listingsInFlight struct {
	mu      sync.Mutex
	now     map[string]int
	most    map[string]int
	listed  map[string]int
	hold    map[string]chan struct{}
	groups  []string
	started chan string
}

func newListingsInFlight(groups ...string) *listingsInFlight {
	return &listingsInFlight{now: map[string]int{}, most: map[string]int{}, listed: map[string]int{},
		hold: map[string]chan struct{}{}, groups: groups, started: make(chan string, 256)}
}

func (l *listingsInFlight) group(set string) string {
	for _, g := range l.groups {
		if strings.HasPrefix(set, g) {
			return g
		}
	}
	return ""
}

// fault counts one listing request, and holds it while its group is held, or else for d.
func (l *listingsInFlight) fault(d time.Duration) func(*http.Request, int64) testpeers.Fault {
	return func(r *http.Request, _ int64) testpeers.Fault {
		if r.URL.Query().Get("list-type") == "" {
			return testpeers.None
		}
		set, _, _ := strings.Cut(r.URL.Query().Get("prefix"), "/")
		g := l.group(set)
		l.mu.Lock()
		if l.now[set]++; l.now[set] == 1 {
			n := 0
			for s := range l.now {
				if l.group(s) == g {
					n++
				}
			}
			l.most[g] = max(l.most[g], n)
		}
		l.listed[set]++
		hold := l.hold[g]
		l.mu.Unlock()
		l.started <- set
		if hold == nil {
			time.Sleep(d) // each listing is held a while, and counted while it is
		} else {
			select {
			case <-hold:
			case <-r.Context().Done():
			}
		}
		l.mu.Lock()
		if l.now[set]--; l.now[set] == 0 {
			delete(l.now, set)
		}
		l.mu.Unlock()
		return testpeers.None
	}
}

// TestListingSlotsOneEndpointManySpellings: eight spellings of one S3 endpoint (case, a trailing
// slash or an empty query, localhost for the loopback address, IPv4-mapped IPv6 forms, a port
// with a leading zero) share one set of per-source listing slots: at most
// --max-concurrent-listings-per-source of their datasets list at once, through the manager.
func TestListingSlotsOneEndpointManySpellings(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "many")
	counts := newListingsInFlight("set")
	proxy := testpeers.StartProxy(t, s.Endpoint, counts.fault(300*time.Millisecond))
	port := proxy.URL[strings.LastIndex(proxy.URL, ":")+1:]
	spellings := []string{
		"http://127.0.0.1:" + port,
		"http://127.0.0.1:" + port + "/",
		"HTTP://127.0.0.1:" + port,
		"http://localhost:" + port + "?",
		"http://LOCALHOST:" + port + "/",
		"http://[::ffff:127.0.0.1]:" + port,
		"http://[::ffff:7f00:1]:" + port + "/",
		"http://127.0.0.1:0" + port,
	}
	for d := range spellings {
		s.Put(t, "many", fmt.Sprintf("set%d/f", d), []byte("x"))
	}
	m := newManager(t, datasource.Config{Limits: datasource.Limits{ListingsPerSource: 2}})
	pool := t.TempDir()
	var wg sync.WaitGroup
	for d, endpoint := range spellings {
		wg.Go(func() {
			spec := mustSpec(t, s3Params(s, endpoint, fmt.Sprintf("s3://many/set%d", d)))
			if _, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}); err != nil {
				t.Errorf("%s: %v", endpoint, err)
			}
		})
	}
	wg.Wait()
	counts.mu.Lock()
	defer counts.mu.Unlock()
	if len(counts.listed) != len(spellings) {
		t.Fatalf("listed through the proxy: %v, want all %d spellings", counts.listed, len(spellings))
	}
	if most := counts.most["set"]; most == 0 || most > 2 {
		t.Fatalf("%d datasets of one endpoint, spelt %d ways, listed at once; want at most the 2 of --max-concurrent-listings-per-source", most, len(spellings))
	}
}

// TestListingSlotsPerNamespace: one namespace's many listings hold at most its share of the
// node's listing slots, each against an endpoint of its own (so no per-source bound stops
// them); a listing of another namespace gets a slot while they are all held.
func TestListingSlotsPerNamespace(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "names")
	const flood = 6
	for d := range flood {
		s.Put(t, "names", fmt.Sprintf("flood%d/f", d), []byte("x"))
	}
	s.Put(t, "names", "quiet/f", []byte("x"))
	counts := newListingsInFlight("flood", "quiet")
	release := make(chan struct{})
	counts.hold["flood"] = release
	var proxies []*testpeers.Proxy
	for range flood + 1 {
		proxies = append(proxies, testpeers.StartProxy(t, s.Endpoint, counts.fault(0)))
	}
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before the proxies close, which waits for the requests they hold
	m := newManager(t, datasource.Config{Limits: datasource.Limits{Listings: 4, ListingsPerNamespace: 2}})
	pool := t.TempDir()
	request := func(endpoint, set, namespace string) datasource.Request {
		spec := mustSpec(t, s3Params(s, endpoint, "s3://names/"+set))
		spec.Namespace = namespace
		return datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}
	}
	for d := range flood {
		if _, err := m.Ensure(ctx, request(proxies[d].URL, fmt.Sprintf("flood%d", d), "flood")); err != nil {
			t.Fatal(err)
		}
	}
	// Two flood listings are under way (their share); the others wait for a slot of their namespace.
	for range 2 {
		<-counts.started
	}
	qctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	quiet := request(proxies[flood].URL, "quiet", "quiet")
	for {
		st, err := m.Wait(qctx, quiet)
		if err != nil {
			t.Fatal(err)
		}
		if st.Ready() {
			break
		}
		if qctx.Err() != nil {
			counts.mu.Lock()
			most := counts.most["flood"]
			counts.mu.Unlock()
			t.Fatalf("the quiet namespace's dataset got no listing slot while the flood namespace's %d listings were held (%s)", most, st)
		}
	}
	counts.mu.Lock()
	most, quietListed := counts.most["flood"], counts.listed["quiet"]
	counts.mu.Unlock()
	if most != 2 || quietListed == 0 {
		t.Fatalf("the flood namespace had %d listings at once, want its share of 2; the quiet one listed %d times", most, quietListed)
	}
	free()
	for d := range flood {
		if _, err := stage(ctx, t, m, request(proxies[d].URL, fmt.Sprintf("flood%d", d), "flood")); err != nil {
			t.Errorf("flood%d: %v", d, err)
		}
	}
}

// TestListingMinRate: a listing whose server trickles its answer (a byte a second: a page would
// take minutes) goes through too few entries a window, loses its slot, and fails with
// Unavailable naming --listing-min-rate; the listing waiting for the node's only slot then runs.
func TestListingMinRate(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	s.Put(t, "data", "slow/f", []byte("x"))
	s.Put(t, "data", "fast/f", []byte("x"))
	var mu sync.Mutex
	slowListings := 0
	started := make(chan struct{}, 16)
	slow := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		f := testpeers.None
		if r.URL.Query().Get("list-type") != "" {
			mu.Lock()
			slowListings++
			mu.Unlock()
			started <- struct{}{}
			f.Trickle = time.Second
		}
		return f
	})
	fast := testpeers.StartProxy(t, s.Endpoint, nil)
	m := newManager(t, datasource.Config{Limits: datasource.Limits{Listings: 1,
		ListingMinRate: 1, ListingRateWindow: 2 * time.Second}})
	// Run stops the staging jobs when it returns: the trickling request ends before its proxy
	// closes, also when the test fails.
	rctx, stop := context.WithCancel(ctx)
	go m.Run(rctx)
	t.Cleanup(stop)
	pool := t.TempDir()
	slowReq := datasource.Request{Spec: mustSpec(t, s3Params(s, slow.URL, "s3://data/slow")), Creds: creds(s), Pool: pool}
	if _, err := m.Ensure(ctx, slowReq); err != nil {
		t.Fatal(err)
	}
	<-started // the slow listing holds the node's only slot
	fctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	fastReq := datasource.Request{Spec: mustSpec(t, s3Params(s, fast.URL, "s3://data/fast")), Creds: creds(s), Pool: pool}
	for {
		st, err := m.Wait(fctx, fastReq)
		if err != nil {
			t.Fatal(err)
		}
		if st.Ready() {
			break
		}
		if fctx.Err() != nil {
			t.Fatalf("the fast dataset waited a minute for the slot the trickling listing holds (%s)", st)
		}
	}
	_, err := stage(ctx, t, m, slowReq)
	if datasource.Code(err) != codes.Unavailable || !strings.Contains(fmt.Sprint(err), "--listing-min-rate") {
		t.Fatalf("trickling listing: got %v (%v), want Unavailable naming --listing-min-rate", datasource.Code(err), err)
	}
	mu.Lock()
	defer mu.Unlock()
	if slowListings == 0 {
		t.Fatal("the slow source was never listed")
	}
}
