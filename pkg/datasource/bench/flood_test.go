package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource"
	cparams "github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/test/testutil"
)

// The listing flood (docs/security.md, "Resources a pod author can consume"): pod authors name
// S3 endpoints that answer every listing page with 1,000 keys and 1,000 common prefixes, truncated
// forever, and an include pattern that keeps none of them. The node plugin's peak memory under
// it is what deploy/csi's memory limit must hold: `make bench-listing-flood`.

// floodServer answers ListObjectsV2 with endless pages; it serves nothing else.
func floodServer(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("list-type") == "" {
			http.Error(w, "", http.StatusForbidden)
			return
		}
		page, _ := strconv.Atoi(q.Get("continuation-token"))
		prefix := q.Get("prefix")
		var b strings.Builder
		b.WriteString(`<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><IsTruncated>true</IsTruncated>`)
		fmt.Fprintf(&b, "<NextContinuationToken>%d</NextContinuationToken>", page+1)
		for i := range 1000 {
			fmt.Fprintf(&b, `<Contents><Key>%sp%d-k%d.bin</Key><Size>1</Size><ETag>"0cc175b9c0f1b6a831c399e269772661"</ETag></Contents>`, prefix, page, i)
		}
		if q.Get("delimiter") != "" {
			for i := range 1000 {
				fmt.Fprintf(&b, "<CommonPrefixes><Prefix>%sp%d-d%d/</Prefix></CommonPrefixes>", prefix, page, i)
			}
		}
		b.WriteString("</ListBucketResult>")
		w.Header().Set("Content-Type", "application/xml")
		w.Write([]byte(b.String()))
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return "http://" + l.Addr().String()
}

type floodResult struct {
	PeakRSS    int64   `json:"peakRSS"`
	CPUSeconds float64 `json:"cpu"`
	Seconds    float64 `json:"seconds"`
	Refused    int     `json:"refused"`
	Volumes    int     `json:"volumes"`
}

// listingFloodChild is the node plugin under the flood: the driver's default limits, 32
// inline volumes at once over 8 flooding endpoints, each retried as kubelet would until it is
// refused or the window ends.
func listingFloodChild(t *testing.T) {
	window, _ := time.ParseDuration(os.Getenv("CISTERN_FLOOD_WINDOW"))
	var endpoints []string
	for range 8 {
		endpoints = append(endpoints, floodServer(t))
	}
	m, err := datasource.NewManager(datasource.Config{Pools: []string{t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	pool := t.TempDir()
	start := time.Now()
	var mu sync.Mutex
	res := floodResult{Volumes: 32}
	var wg sync.WaitGroup
	for v := range res.Volumes {
		wg.Go(func() {
			p, err := cparams.Parse(map[string]string{"source": fmt.Sprintf("s3://flood/v%d", v),
				"endpoint": endpoints[v%len(endpoints)], "pathStyle": "true", "include": "**/*.never"}, cparams.Inline)
			if err != nil {
				t.Error(err)
				return
			}
			spec := datasource.SpecOf(p.Dataset)
			for ctx.Err() == nil {
				_, err := m.Wait(ctx, datasource.Request{Spec: spec, Pool: pool})
				if err != nil {
					mu.Lock()
					res.Refused++
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	res.Seconds = time.Since(start).Seconds()
	res.CPUSeconds = cpuSeconds()
	res.PeakRSS = peakRSS(os.Getpid())
	b, _ := json.Marshal(res)
	fmt.Printf("RESULT %s\n", b)
}

// BenchmarkListingFlood runs the flood child and reports its peak memory and CPU.
//
//	CISTERN_FLOOD_WINDOW=2m   how long the flood lasts (default 2m)
func BenchmarkListingFlood(b *testing.B) {
	window := os.Getenv("CISTERN_FLOOD_WINDOW")
	if window == "" {
		window = "2m"
	}
	cmd := testutil.ChildCommand("listing-flood", "CISTERN_FLOOD_WINDOW="+window)
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("flood child: %v\n%s", err, out)
	}
	var res floodResult
	for _, line := range strings.Split(string(out), "\n") {
		if j, ok := strings.CutPrefix(line, "RESULT "); ok {
			if err := json.Unmarshal([]byte(j), &res); err != nil {
				b.Fatal(err)
			}
		}
	}
	if res.Volumes == 0 {
		b.Fatalf("no result from the flood child:\n%s", out)
	}
	fmt.Printf("listing flood: %d volumes, %d refused in %.0fs; peak RSS %d MiB; CPU %.1fs (%.2f cores)\n",
		res.Volumes, res.Refused, res.Seconds, res.PeakRSS>>20, res.CPUSeconds, res.CPUSeconds/res.Seconds)
	b.ReportMetric(float64(res.PeakRSS>>20), "peak-MiB")
	b.ReportMetric(res.CPUSeconds/res.Seconds, "cores")
}
