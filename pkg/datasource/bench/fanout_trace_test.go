package bench

// CISTERN_FANOUT_TRACE=1: each node of BenchmarkFanout's peers-on groups reports where its time
// went (phases, bytes by origin, its log at -v=2), for the closing note rather than the figures;
// with CISTERN_FANOUT_CPUPROFILE=<dir> too, each writes a CPU profile there.

import (
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource"
)

func tracing() bool { return os.Getenv("CISTERN_FANOUT_TRACE") != "" }

// traceNode logs the node's phases as they change until stop is called, then its bytes by origin.
func traceNode(m *datasource.Manager, pool string, spec *datasource.Spec) (stop func()) {
	if !tracing() {
		return func() {}
	}
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("v", "2")
	if dir := os.Getenv("CISTERN_FANOUT_CPUPROFILE"); dir != "" {
		if f, err := os.CreateTemp(dir, "node-*.pprof"); err == nil {
			_ = pprof.StartCPUProfile(f)
		}
	}
	start := time.Now()
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		var last datasource.Phase
		var lastBytes int64
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		sec := 0
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			st, _, _ := m.Status(pool, spec)
			el := time.Since(start)
			if st.Phase != last {
				fmt.Printf("TRACE %.2fs phase %s bytes %d\n", el.Seconds(), st.Phase, st.BytesDone)
				last = st.Phase
			}
			if int(el.Seconds()) > sec {
				sec = int(el.Seconds())
				src := fetched(m)["source"]
				fmt.Printf("TRACE %.2fs bytes %d (+%d MB) source %.0f MB\n", el.Seconds(), st.BytesDone, (st.BytesDone-lastBytes)/1e6, src/1e6)
				lastBytes = st.BytesDone
			}
		}
	}()
	return func() {
		close(done)
		<-finished
		pprof.StopCPUProfile()
		for origin, v := range fetched(m) {
			fmt.Printf("TRACE fetched %v %.0f MB\n", origin, v/1e6)
		}
	}
}

// fetched is the bytes the node's stagings read so far, by origin.
func fetched(m *datasource.Manager) map[string]float64 {
	out := map[string]float64{}
	reg := prometheus.NewRegistry()
	_ = reg.Register(m.Collector())
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if !strings.Contains(mf.GetName(), "fetched_bytes") {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "origin" {
					out[l.GetValue()] += mt.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}
