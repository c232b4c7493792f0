package bench

// `make bench-fanout`: N simulated nodes stage the same dataset from one S3 server behind a
// throttling proxy, with and without peer fan-out (docs/benchmarks.md, "Peer fan-out").
//
// Each node is a process of its own (a child of this benchmark, as TestStagingChild stands for
// the driver): the driver's staging engine (datasource.Manager) and its peer port (peer.Server,
// TLS and tokens as in a cluster), over a pool that is an ext4 filesystem of its own. Peers are on
// loopback, each on its own port; they find each other through a directory of files the nodes
// write (in a cluster, the StoragePool inventory: the e2e suite covers that path; here it would
// take an API server, etcd and a storagepool-sidecar per node, whose CPU the nodes would share). S3 is
// versitygw behind a proxy that caps all responses together at 200 MB/s, a realistic share of an
// object store for one client, and counts the bytes it sends: the S3 bytes read.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	cparams "github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// s3BytesPerSec is the S3 server's bandwidth, shared by every node.
const s3BytesPerSec = 200e6

// fanoutNode is a node child's configuration.
type fanoutNode struct {
	Name, Pool, Listen, Directory string
	Peers                         bool
	Params                        map[string]string
	// UploadBytesPerSec is --peer-upload-bandwidth.
	UploadBytesPerSec int64
}

// discoveryDelay is how long after a node starts staging the others see it as a peer: in the
// product, the driver's inventory generation moves when a staging starts, the sidecar hears it
// on its WatchStoragePools stream and applies the StoragePool's status, and every node's
// discovery informer gets the watch event (docs/storagepools.md, "When it is written"). 1 s
// stands for those steps on a loaded API server; CISTERN_FANOUT_DISCOVERY_DELAY changes it.
func discoveryDelay() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("CISTERN_FANOUT_DISCOVERY_DELAY")); err == nil {
		return d
	}
	return time.Second
}

// uploadBytesPerSec is the nodes' upload cap: the DaemonSet's 256 MiB/s, or
// CISTERN_FANOUT_UPLOAD_MIBS (MiB/s) to see how much of a case's time the cap decides.
func uploadBytesPerSec() int64 {
	if v, err := strconv.ParseInt(os.Getenv("CISTERN_FANOUT_UPLOAD_MIBS"), 10, 64); err == nil && v > 0 {
		return v << 20
	}
	return 256 << 20
}

// benchToken is the peer token of every bench node (TokenReview's job in a cluster).
const benchToken = "bench-node"

type benchAuth struct{}

func (benchAuth) Authenticate(_ context.Context, token string) (string, error) {
	node, ok := strings.CutPrefix(token, benchToken+":")
	if !ok || node == "" {
		return "", peer.ErrUnauthenticated
	}
	return node, nil
}

// dirPeers is a peer.Directory of the files nodes write into a directory.
type dirPeers struct {
	dir string
	mu  sync.Mutex
	at  time.Time
	ps  []peer.Peer
}

func (d *dirPeers) Peers(string) []peer.Peer {
	d.mu.Lock()
	defer d.mu.Unlock()
	if time.Since(d.at) < 200*time.Millisecond {
		return d.ps
	}
	d.ps, d.at = nil, time.Now()
	ents, _ := os.ReadDir(d.dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue // being written
		}
		b, err := os.ReadFile(filepath.Join(d.dir, e.Name()))
		var p peer.Peer
		if err == nil && json.Unmarshal(b, &p) == nil {
			d.ps = append(d.ps, p)
		}
	}
	return d.ps
}

// fanoutNodeChild is one node of BenchmarkFanout. It starts serving peers, stages the dataset
// when told "go" on stdin, reports its time, and serves until stdin closes.
func fanoutNodeChild(t *testing.T) {
	var cfg fanoutNode
	if err := json.Unmarshal([]byte(os.Getenv("CISTERN_BENCH_PARAMS")), &cfg); err != nil {
		t.Fatal(err)
	}
	v, err := cparams.Parse(cfg.Params, cparams.StorageClass)
	if err != nil {
		t.Fatal(err)
	}
	dc := datasource.Config{AccessProofTTL: datasource.DefaultAccessProofTTL}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if cfg.Peers {
		if dc.Peers, err = peer.NewNetwork(peer.NetworkConfig{Self: cfg.Name, Directory: &dirPeers{dir: cfg.Directory},
			Token: func() (string, error) { return benchToken + ":" + cfg.Name, nil }}); err != nil {
			t.Fatal(err)
		}
	}
	m, err := datasource.NewManager(dc)
	if err != nil {
		t.Fatal(err)
	}
	var self peer.Peer
	if cfg.Peers {
		cert, hash, err := peer.SelfSigned(cfg.Name)
		if err != nil {
			t.Fatal(err)
		}
		// The DaemonSet's limits: 256 MiB/s (unless CISTERN_FANOUT_UPLOAD_MIBS) and 8 requests at
		// once (a batch counts as one).
		srv, err := peer.NewServer(peer.ServerConfig{Store: m, Auth: benchAuth{}, Self: cfg.Name, Cert: cert, BandwidthBytesPerSec: cfg.UploadBytesPerSec, MaxUploads: 8})
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(ctx, l)
		self = peer.Peer{Node: cfg.Name, Address: l.Addr().String(), CertHash: hash}
	}
	in := bufio.NewReader(os.Stdin)
	fmt.Println("LISTENING")
	if _, err := in.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if cfg.Peers {
		// As in the product, the others learn of this node only once its StoragePool reports
		// the dataset Staging: after it starts, and after the sidecar's write and the watch
		// event reach them (discoveryDelay).
		go func() {
			time.Sleep(discoveryDelay())
			b, _ := json.Marshal(self)
			tmp := filepath.Join(cfg.Directory, "."+cfg.Name)
			if err := os.WriteFile(tmp, b, 0o644); err == nil {
				_ = os.Rename(tmp, filepath.Join(cfg.Directory, cfg.Name))
			}
		}()
	}
	req := datasource.Request{Spec: datasource.SpecOf(v.Dataset), Pool: cfg.Pool, Creds: datasource.Credentials{
		AccessKeyID: os.Getenv("CISTERN_BENCH_AK"), SecretAccessKey: os.Getenv("CISTERN_BENCH_SK")}}
	stopTrace := func() {}
	if cfg.Peers {
		stopTrace = traceNode(m, cfg.Pool, req.Spec)
	}
	start := time.Now()
	if _, err := m.Wait(ctx, req); err != nil {
		t.Fatal(err)
	}
	stopTrace()
	fmt.Printf("RESULT %.3f %.3f\n", time.Since(start).Seconds(), cpuSeconds())
	_, _ = io.Copy(io.Discard, in) // serve peers until the benchmark is done
}

// throttle is a reverse proxy to S3 that sends at most s3BytesPerSec across all responses and
// counts what it sends.
type throttle struct {
	proxy   *httputil.ReverseProxy
	limiter *rate.Limiter
	sent    atomic.Int64
}

func startThrottle(b *testing.B, target string) (*throttle, string) {
	u, err := url.Parse(target)
	if err != nil {
		b.Fatal(err)
	}
	th := &throttle{proxy: httputil.NewSingleHostReverseProxy(u), limiter: rate.NewLimiter(s3BytesPerSec, 256<<10)}
	th.proxy.Transport = &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}
	th.proxy.ModifyResponse = func(r *http.Response) error {
		r.Body = &throttled{rc: r.Body, th: th}
		return nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: th.proxy}
	go srv.Serve(l)
	b.Cleanup(func() { srv.Close() })
	return th, "http://" + l.Addr().String()
}

type throttled struct {
	rc io.ReadCloser
	th *throttle
}

func (t *throttled) Read(p []byte) (int, error) {
	if len(p) > 256<<10 {
		p = p[:256<<10]
	}
	n, err := t.rc.Read(p)
	if n > 0 {
		_ = t.th.limiter.WaitN(context.Background(), n)
		t.th.sent.Add(int64(n))
	}
	return n, err
}

func (t *throttled) Close() error { return t.rc.Close() }

// child is a running node process.
type child struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	results chan [2]float64
	done    func()
	// log is the node's output other than its result lines; read only once results is closed.
	log *strings.Builder
}

// startNode starts a node process with a fresh pool filesystem.
func startNode(b *testing.B, s *testpeers.S3, work, name, dir string, peers bool, params map[string]string, poolSize int64) *child {
	pool, done := freshFS(b, work, name, poolSize)
	cfg, _ := json.Marshal(fanoutNode{Name: name, Pool: filepath.Join(pool, "pool"), Listen: "127.0.0.1:0", Directory: dir, Peers: peers, Params: params,
		UploadBytesPerSec: uploadBytesPerSec()})
	cmd := testutil.ChildCommand("fanout-node", "CISTERN_BENCH_PARAMS="+string(cfg),
		"CISTERN_BENCH_AK="+s.AccessKey, "CISTERN_BENCH_SK="+s.SecretKey)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	c := &child{cmd: cmd, stdin: stdin, results: make(chan [2]float64, 1), log: &strings.Builder{}}
	listening := make(chan struct{})
	log := c.log
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "LISTENING":
				close(listening)
			case strings.HasPrefix(line, "RESULT "):
				var r [2]float64
				fmt.Sscanf(strings.TrimPrefix(line, "RESULT "), "%f %f", &r[0], &r[1])
				c.results <- r
			default:
				if log.Len() < 1<<20 {
					log.WriteString(line + "\n")
				}
			}
		}
		close(c.results)
	}()
	c.done = sync.OnceFunc(func() {
		stdin.Close()
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		done()
	})
	b.Cleanup(c.done)
	select {
	case <-listening:
	case <-time.After(time.Minute):
		b.Fatalf("node %s did not start:\n%s", name, log.String())
	}
	return c
}

func (c *child) start(b *testing.B) {
	if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
		b.Fatal(err)
	}
}

// wait returns the node's staging time and its process's CPU time until then.
func (c *child) wait(b *testing.B, name string) (float64, float64) {
	r, ok := <-c.results
	if !ok {
		out := c.log.String()
		b.Fatalf("node %s failed; the end of its log:\n%s", name, out[max(0, len(out)-8000):])
	}
	return r[0], r[1]
}

// result is one group's run.
type result struct {
	all, late float64 // seconds until all n nodes are Ready; the late node's staging
	cpu       float64 // CPU seconds of the n nodes' processes until each was Ready
	s3Bytes   int64
	// The machine's work in the same windows (procCPU): until all n are Ready, the n nodes',
	// the S3 server's and this process's (the throttling proxy); while the late node stages,
	// its own and the n nodes' that serve it.
	nodesCPU, s3CPU, proxyCPU float64
	lateCPU, servingCPU       float64
	// busy and iowait are the machine's, all cores, in the same window (/proc/stat): kernel
	// threads too (the loop devices' I/O, writeback), and any other work on the machine.
	busy, iowait float64
}

// cpuSplit is the run's CPU seconds (the nodes', S3's, the proxy's) and how busy the machine's
// cores were meanwhile: with the run's processes, and with all else (kernel threads such as the
// loop devices', and other processes: other engineers' builds on a shared machine).
func (r result) cpuSplit(cores float64) string {
	own := r.nodesCPU + r.s3CPU + r.proxyCPU
	return fmt.Sprintf("%.1fs: nodes %.1f, S3 %.1f, proxy %.1f; cores busy %.0f%%, %.0f%% outside the run's processes, %.0f%% waiting for I/O",
		own, r.nodesCPU, r.s3CPU, r.proxyCPU, 100*r.busy/(cores*r.all), 100*max(0, r.busy-own)/(cores*r.all), 100*r.iowait/(cores*r.all))
}

// procCPU is a process's CPU seconds so far, all its threads (0 when it is gone).
func procCPU(pid int) float64 {
	own, _ := testutil.ProcCPU(pid)
	return own
}

func nodesCPU(nodes []*child) float64 {
	var sum float64
	for _, c := range nodes {
		sum += procCPU(c.cmd.Process.Pid)
	}
	return sum
}

// loadRange samples the 1-minute load average every 5 s until stop is called, and returns the
// lowest and highest seen.
func loadRange() (stop func() string) {
	var (
		mu     sync.Mutex
		lo, hi = loadAverage(), loadAverage()
		done   = make(chan struct{})
	)
	sample := func() {
		l := loadAverage()
		mu.Lock()
		defer mu.Unlock()
		if v, _ := strconv.ParseFloat(l, 64); v < atof(lo) {
			lo = l
		} else if v > atof(hi) {
			hi = l
		}
	}
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				sample()
			}
		}
	}()
	return func() string {
		close(done)
		sample()
		mu.Lock()
		defer mu.Unlock()
		return lo + "-" + hi
	}
}

func atof(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }

// group runs n nodes starting together (and, with late, one more once they are Ready).
func group(b *testing.B, s *testpeers.S3, th *throttle, work string, n int, peers, late bool, params map[string]string, poolSize int64) (r result) {
	dir := filepath.Join(work, "peers")
	os.RemoveAll(dir)
	os.MkdirAll(dir, 0o755)
	nodes := make([]*child, n)
	for k := range n {
		nodes[k] = startNode(b, s, work, fmt.Sprintf("node-%02d", k), dir, peers, params, poolSize)
	}
	before := th.sent.Load()
	cpu0, s3cpu0, self0 := nodesCPU(nodes), procCPU(s.Pid()), cpuSeconds()
	_, busy0, iowait0, _ := testutil.MachineCPU()
	for _, c := range nodes {
		c.start(b)
	}
	for k, c := range nodes {
		secs, cpu := c.wait(b, fmt.Sprintf("node-%02d", k))
		r.all, r.cpu = max(r.all, secs), r.cpu+cpu
	}
	r.nodesCPU, r.s3CPU, r.proxyCPU = nodesCPU(nodes)-cpu0, procCPU(s.Pid())-s3cpu0, cpuSeconds()-self0
	_, busy1, iowait1, _ := testutil.MachineCPU()
	r.busy, r.iowait = busy1-busy0, iowait1-iowait0
	if late {
		c := startNode(b, s, work, "node-late", dir, peers, params, poolSize)
		serving0, late0 := nodesCPU(nodes), procCPU(c.cmd.Process.Pid)
		c.start(b)
		r.late, _ = c.wait(b, "node-late")
		r.servingCPU, r.lateCPU = nodesCPU(nodes)-serving0, procCPU(c.cmd.Process.Pid)-late0
		c.done()
	}
	r.s3Bytes = th.sent.Load() - before
	for _, c := range nodes {
		c.done()
	}
	if peers && tracing() {
		for k, c := range nodes {
			b.Logf("node-%02d (of %d):\n%s", k, n, c.log.String())
		}
	}
	return r
}

// samples is how many times each case runs (CISTERN_FANOUT_SAMPLES, at least 3).
func samples() int {
	if v, err := strconv.Atoi(os.Getenv("CISTERN_FANOUT_SAMPLES")); err == nil && v >= 3 {
		return v
	}
	return 3
}

func medianOf(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// spread is "median(min–max)".
func spread(v []float64) string {
	return fmt.Sprintf("%.2f(%.2f-%.2f)", medianOf(v), slices.Min(v), slices.Max(v))
}

// Knobs: CISTERN_BENCH_DIR (where S3 data and pools live), CISTERN_BENCH_ONLY (datasets whose
// name contains it), CISTERN_FANOUT_NODES (comma-separated node counts; default 4,8),
// CISTERN_FANOUT_OFF=0 (no peers-off groups: a shorter run when only the peers are looked at),
// CISTERN_FANOUT_UPLOAD_MIBS (the nodes' upload cap; default the DaemonSet's 256),
// CISTERN_FANOUT_TRACE and CISTERN_FANOUT_CPUPROFILE (fanout_trace_test.go: where each node's time
// goes; not for the figures).
func BenchmarkFanout(b *testing.B) {
	base := os.Getenv("CISTERN_BENCH_DIR")
	if base == "" {
		base = b.TempDir()
	}
	s := testpeers.StartS3(b, filepath.Join(base, "s3"))
	th, endpoint := startThrottle(b, s.Endpoint)
	counts := []int{4, 8}
	if v := os.Getenv("CISTERN_FANOUT_NODES"); v != "" {
		counts = nil
		for _, f := range strings.Split(v, ",") {
			var k int
			fmt.Sscanf(f, "%d", &k)
			counts = append(counts, k)
		}
	}
	withOff := os.Getenv("CISTERN_FANOUT_OFF") != "0"
	var lines []string
	for i, sh := range shapes {
		if sh.name == "100 × 64 MiB" {
			continue // the two sets: one large object, many small ones
		}
		if only := os.Getenv("CISTERN_BENCH_ONLY"); only != "" && !strings.Contains(sh.name, only) {
			continue
		}
		bucket := fmt.Sprintf("fanout%d", i)
		os.RemoveAll(filepath.Join(s.Dir, bucket)) // left by an interrupted run in CISTERN_BENCH_DIR
		s.Bucket(b, bucket)
		upload(b, s, bucket, sh)
		size := int64(sh.objects) * sh.size
		params := map[string]string{"source": "s3://" + bucket, "endpoint": endpoint, "pathStyle": "true"}
		// A pool holds the dataset and its filesystem's overhead; the image files are sparse.
		poolSize := size + size/4 + 1<<30
		work := filepath.Join(base, "work")
		os.RemoveAll(work)
		os.MkdirAll(work, 0o755)

		cores := float64(cpus())
		for _, n := range counts {
			// Each sample measures one node alone from S3 (the baseline) right before the n
			// nodes with peers and without, so that every ratio compares runs made under the
			// same load.
			var allR, lateR, offR, s3R, boundR []float64
			for k := range samples() {
				load := loadRange()
				alone := group(b, s, th, work, 1, false, false, params, poolSize)
				aloneCPU := alone.nodesCPU + alone.s3CPU + alone.proxyCPU
				on := group(b, s, th, work, n, true, true, params, poolSize)
				var off result
				if withOff {
					off = group(b, s, th, work, n, false, false, params, poolSize)
				}
				// What a node's process spent per GiB staged, alone and in the swarm.
				gib := float64(size) / (1 << 30)
				b.Logf("%s, %d nodes, sample %d: alone %.2fs (CPU %s), with peers all Ready %.2fs (CPU %s), late %.2fs, without peers %.2fs; node CPU-s per GiB alone %.2f, with peers %.2f; %.2f GB from S3; load %s",
					sh.name, n, k+1, alone.all, alone.cpuSplit(cores), on.all, on.cpuSplit(cores), on.late, off.all,
					alone.nodesCPU/gib, on.nodesCPU/float64(n)/gib, float64(on.s3Bytes)/1e9, load())
				// What no protocol can beat, from work that does not depend on this one: each
				// of the n nodes must do at least what one node alone does (n × its CPU on the
				// machine's cores), and the set must cross the S3 link once.
				bound := max(float64(n)*aloneCPU/cores, float64(size)/s3BytesPerSec)
				allR = append(allR, on.all/alone.all)
				lateR = append(lateR, on.late/alone.all)
				offR = append(offR, off.all/alone.all)
				s3R = append(s3R, float64(on.s3Bytes)/float64(size))
				boundR = append(boundR, bound/alone.all)
			}
			offRatio := "skipped"
			if withOff {
				offRatio = spread(offR)
			}
			line := fmt.Sprintf("fanout: dataset=%q nodes=%d samples=%d all_ready_ratio=%s bound_ratio=%s late_ratio=%s off_all_ready_ratio=%s s3_bytes_ratio=%s goal_all_ready<=1.5=%v",
				sh.name, n, len(allR), spread(allR), spread(boundR), spread(lateR), offRatio, spread(s3R), medianOf(allR) <= 1.5)
			lines = append(lines, line)
			b.Log(line)
		}
		os.RemoveAll(work)
		os.RemoveAll(filepath.Join(s.Dir, bucket))
	}
	fmt.Printf("\n(S3 capped at %.0f MB/s across all nodes; %s, %d CPUs, load average %s)\n", s3BytesPerSec/1e6,
		time.Now().UTC().Format("2006-01-02"), cpus(), loadAverage())
	for _, l := range lines {
		fmt.Println(l)
	}
}
