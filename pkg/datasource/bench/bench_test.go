// Package bench measures dataset staging against the copiers users run instead (rclone, the AWS
// SDK's transfer manager, `aws s3 cp --recursive`) and cp -r, on the same machine, in one run:
// `make bench-datasource`. It is a benchmark of whole systems (a real S3 server, real disks), so
// each figure is measured once per run and reported as a ratio to its peers.
package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"golang.org/x/sys/unix"

	"github.com/cistern-csi/cistern/pkg/datasource"
	cparams "github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

type shape struct {
	name    string
	objects int
	size    int64
	// partSize > 0 uploads with multipart (composite ETag).
	partSize int64
	key      func(i int) string
}

var shapes = []shape{
	{name: "1 × 2 GiB", objects: 1, size: 2 << 30, partSize: 64 << 20, key: func(int) string { return "model.bin" }},
	{name: "100 × 64 MiB", objects: 100, size: 64 << 20, key: func(i int) string { return fmt.Sprintf("shard-%03d.bin", i) }},
	{name: "20,000 × 32 KiB", objects: 20000, size: 32 << 10, key: func(i int) string {
		return fmt.Sprintf("train/%02d/%02d/sample-%05d.bin", i%20, (i/20)%25, i)
	}},
}

// childResult is what a child process reports: the staging child, or the transfer manager's
// (which fills only StageSeconds, CPUSeconds and MaxRSSBytes).
// stagedLine is what a child prints once its copy is on disk: the parent times every copier
// from before it starts the process to that point (rclone's and awscli's exit, this line for
// the Go children), so process start counts for all alike.
const stagedLine = "STAGED"

type childResult struct {
	// OutsideSeconds is the parent's time from before the child's start to its stagedLine.
	OutsideSeconds float64 `json:"-"`
	StageSeconds   float64 `json:"stage"`
	HitSeconds     float64 `json:"hit"`
	// FullHitSeconds is a cache hit for a caller whose access proof is not remembered: it lists
	// the dataset and reads one file.
	FullHitSeconds  float64 `json:"fullHit"`
	PopulateSeconds float64 `json:"populate"`
	MaxRSSBytes     int64   `json:"maxRSS"`
	// CPUSeconds is the staging process's own CPU time (user + system) for the first staging.
	CPUSeconds float64 `json:"cpu"`
}

// The benchmarks' helper processes, by the names copyChild, BenchmarkListingFlood and startNode
// start them with.
func TestMain(m *testing.M) {
	testutil.RunChild(map[string]func(*testing.T){
		"staging": stagingChild, "transfer-manager": transferManagerChild,
		"listing-flood": listingFloodChild, "fanout-node": fanoutNodeChild,
	})
	os.Exit(m.Run())
}

// stagingChild is the process whose staging the benchmark times and whose peak memory it
// reads: it stands for the driver.
func stagingChild(t *testing.T) {
	var params map[string]string
	json.Unmarshal([]byte(os.Getenv("CISTERN_BENCH_PARAMS")), &params)
	v, err := cparams.Parse(params, cparams.StorageClass)
	if err != nil {
		t.Fatal(err)
	}
	spec := datasource.SpecOf(v.Dataset)
	m, err := datasource.NewManager(datasource.Config{AccessProofTTL: datasource.DefaultAccessProofTTL})
	if err != nil {
		t.Fatal(err)
	}
	req := datasource.Request{Spec: spec, Pool: os.Getenv("CISTERN_BENCH_POOL"), Creds: datasource.Credentials{
		AccessKeyID: os.Getenv("CISTERN_BENCH_AK"), SecretAccessKey: os.Getenv("CISTERN_BENCH_SK")}}
	ctx := context.Background()
	var res childResult
	startProfile(t)
	start := time.Now()
	if _, err := m.Wait(ctx, req); err != nil {
		t.Fatal(err)
	}
	res.StageSeconds = time.Since(start).Seconds()
	fmt.Println(stagedLine) // the parent's clock stops here, as it does at rclone's exit
	res.CPUSeconds = cpuSeconds()
	pprof.StopCPUProfile()
	// A second volume of the same dataset: Ensure is a cache hit, then the read-only tree is
	// referenced for a bind mount.
	start = time.Now()
	st, err := m.Ensure(ctx, req)
	if err != nil || !st.CacheHit {
		t.Fatalf("second Ensure: %v %v", st, err)
	}
	if _, err := m.Acquire(req.Pool, spec, st.Version, "bench-volume"); err != nil {
		t.Fatal(err)
	}
	res.HitSeconds = time.Since(start).Seconds()
	// The same hit for a caller with no remembered proof (another tenant, or after a restart).
	fresh, err := datasource.NewManager(datasource.Config{})
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if st, err := fresh.Ensure(ctx, req); err != nil || !st.CacheHit {
		t.Fatalf("cache hit with a full proof: %v %v", st, err)
	}
	res.FullHitSeconds = time.Since(start).Seconds()
	if target := os.Getenv("CISTERN_BENCH_POPULATE"); target != "" {
		start = time.Now()
		if err := m.Populate(ctx, req.Pool, spec, st.Version, target); err != nil {
			t.Fatal(err)
		}
		res.PopulateSeconds = time.Since(start).Seconds()
	}
	res.MaxRSSBytes = peakRSS(os.Getpid())
	b, _ := json.Marshal(res)
	fmt.Printf("RESULT %s\n", b)
}

// Concurrency of the copiers Cistern is compared with: as many objects in flight as Cistern's
// default (16 parallel reads), which is also what each tool's docs say to raise for throughput
// (rclone --transfers, the transfer manager's Concurrency, awscli's max_concurrent_requests).
const peerConcurrency = 16

// transferManagerChild downloads a bucket with the AWS SDK's transfer manager
// (DownloadDirectory) in a process of its own, so its CPU time and peak memory are measured as
// the staging child's are.
func transferManagerChild(t *testing.T) {
	var p struct{ Endpoint, Bucket, Dest string }
	if err := json.Unmarshal([]byte(os.Getenv("CISTERN_BENCH_PARAMS")), &p); err != nil {
		t.Fatal(err)
	}
	// The same client as the tests' (static credentials, path style, 64 idle connections per
	// host, enough for every worker to keep its own).
	peer := &testpeers.S3{AccessKey: os.Getenv("CISTERN_BENCH_AK"), SecretKey: os.Getenv("CISTERN_BENCH_SK")}
	// Tuned as the SDK's docs say for a fast link: more concurrency (default 5) and large parts.
	// Concurrency is both the objects in flight and the parts in flight of one multipart object
	// (DownloadDirectory passes the client's options to each DownloadObject). Parts mode (the
	// default) reads a multipart object by its upload's part numbers (64 MiB here); PartSizeBytes
	// sizes the ranges of ranges mode only, set to the same for clarity.
	tm := transfermanager.New(peer.NewClient(p.Endpoint), func(o *transfermanager.Options) {
		o.Concurrency = peerConcurrency
		o.PartSizeBytes = 64 << 20
	})
	startProfile(t)
	start := time.Now()
	out, err := tm.DownloadDirectory(context.Background(), &transfermanager.DownloadDirectoryInput{
		Bucket: aws.String(p.Bucket), Destination: aws.String(p.Dest)})
	if err != nil {
		t.Fatal(err)
	}
	if out.ObjectsFailed != 0 {
		t.Fatalf("transfer manager: %d objects failed", out.ObjectsFailed)
	}
	syncfs(t, p.Dest)
	fmt.Println(stagedLine)
	pprof.StopCPUProfile()
	res := childResult{StageSeconds: time.Since(start).Seconds(), CPUSeconds: cpuSeconds(), MaxRSSBytes: peakRSS(os.Getpid())}
	b, _ := json.Marshal(res)
	fmt.Printf("RESULT %s\n", b)
}

// startProfile starts a CPU profile of a child process when the benchmark asks for one.
func startProfile(t *testing.T) {
	if path := os.Getenv("CISTERN_BENCH_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		pprof.StartCPUProfile(f)
	}
}

// Knobs for tuning runs (the make target sets none of them):
//
//	CISTERN_BENCH_DIR=/path    where the S3 server's data and the copies live (default: a temp dir)
//	CISTERN_BENCH_REUSE=1      keep uploaded buckets in CISTERN_BENCH_DIR and reuse them next time
//	CISTERN_BENCH_ONLY="2 GiB" only the datasets whose name contains this
//	CISTERN_BENCH_REPS=n       measure each copier n times (default 3) and report medians
//	CISTERN_BENCH_PROFILE=dir  write the staging and transfer manager children's CPU profiles
//	                           there, one per dataset
func BenchmarkStaging(b *testing.B) {
	// The copiers' order in each round: drawn from CISTERN_BENCH_SEED, or from the clock (logged).
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("CISTERN_BENCH_SEED"), 10, 64); err == nil {
		seed = v
	}
	b.Logf("copier order seed %d (CISTERN_BENCH_SEED)", seed)
	order := rand.New(rand.NewPCG(seed, 0))
	base := os.Getenv("CISTERN_BENCH_DIR")
	if base == "" {
		base = b.TempDir()
	}
	reuse := os.Getenv("CISTERN_BENCH_REUSE") != ""
	reps := 3
	if n, err := strconv.Atoi(os.Getenv("CISTERN_BENCH_REPS")); err == nil && n > 0 {
		reps = n
	}
	// Every copier must be there: a missing one fails the benchmark (under make, or CI=true).
	rclone := testpeers.Binary(b, "CISTERN_RCLONE")
	awscli := testpeers.Binary(b, "CISTERN_AWSCLI")
	s := testpeers.StartS3(b, filepath.Join(base, "s3"))
	awsConfig := writeAWSConfig(b, base)
	var report strings.Builder
	columns := []string{"dataset", "Cistern staging", "rclone copy --transfers 16", "transfer manager DownloadDirectory",
		"aws s3 cp --recursive", "cp -r", "Cistern / rclone", "Cistern / transfer manager", "Cistern / awscli",
		"Cistern / fastest of the three", "Cistern / cp -r", "cache hit", "hit / staging", "first hit for a caller",
		"first hit / staging", "writable copy from cache", "peak RSS Cistern", "peak RSS rclone",
		"peak RSS transfer manager", "peak RSS awscli", "CPU Cistern", "CPU rclone", "CPU transfer manager",
		"CPU awscli", "load average"}
	fmt.Fprintf(&report, "| %s |\n", strings.Join(columns, " | "))
	fmt.Fprintf(&report, "|%s\n", strings.Repeat(" --- |", len(columns)))
	var verdicts []string
	for i, sh := range shapes {
		if only := os.Getenv("CISTERN_BENCH_ONLY"); only != "" && !strings.Contains(sh.name, only) {
			continue
		}
		bucket := fmt.Sprintf("bench%d", i)
		uploaded := filepath.Join(base, bucket+".uploaded")
		if _, err := os.Stat(uploaded); err != nil || !reuse {
			os.RemoveAll(filepath.Join(s.Dir, bucket))
			s.Bucket(b, bucket)
			upStart := time.Now()
			upload(b, s, bucket, sh)
			b.Logf("%s: uploaded in %s", sh.name, time.Since(upStart))
			if reuse {
				os.WriteFile(uploaded, nil, 0o644)
			}
		}
		debug.FreeOSMemory()
		work := filepath.Join(base, fmt.Sprintf("run%d", i))
		os.RemoveAll(work)
		os.MkdirAll(work, 0o755)
		// Each copier writes into a fresh filesystem of its own, sized for the dataset and a
		// writable copy of it.
		fsSize := 3*int64(sh.objects)*sh.size + 1<<30
		fresh := func(name string) (string, func()) { return freshFS(b, work, name, fsSize) }

		// The copiers take turns in a random order, so a burst of other load hits them alike.
		var cps, rcs, tms, awss, stages []time.Duration
		var ress []childResult
		var rcRSS, tmRSS, awsRSS int64
		var rcCPUs, tmCPUs, awsCPUs []float64
		load := loadAverage()
		for r := range reps {
			profile, tmProfile := "", ""
			if dir := os.Getenv("CISTERN_BENCH_PROFILE"); dir != "" && r == 0 {
				profile = filepath.Join(dir, bucket+".cpu.pprof")
				tmProfile = filepath.Join(dir, bucket+".transfermanager.cpu.pprof")
			}
			// Every copier is a process timed from before its start until its copy is on disk
			// (its exit, or a Go child's stagedLine), and every output is checked; they run in
			// an order drawn anew each round (seeded, logged), so neither a warmer cache nor a
			// burst of other load favours one.
			var res childResult
			copiers := []struct {
				name string
				run  func()
			}{
				{"cp -r", func() {
					// The disk's limit for the same files (plus one sync, as staging does).
					dst, done := fresh("cp")
					defer done()
					dropCaches(b)
					start := time.Now()
					_, _ = run(b, nil, "cp", "-r", filepath.Join(s.Dir, bucket), filepath.Join(dst, "copy"))
					syncfs(b, dst)
					cps = append(cps, time.Since(start))
				}},
				{"rclone", func() {
					dst, done := fresh("rclone")
					defer done()
					env := []string{"RCLONE_CONFIG=/dev/null", "RCLONE_CONFIG_SRC_TYPE=s3", "RCLONE_CONFIG_SRC_PROVIDER=Other",
						"RCLONE_CONFIG_SRC_ENDPOINT=" + s.Endpoint, "RCLONE_CONFIG_SRC_ACCESS_KEY_ID=" + s.AccessKey,
						"RCLONE_CONFIG_SRC_SECRET_ACCESS_KEY=" + s.SecretKey, "RCLONE_CONFIG_SRC_FORCE_PATH_STYLE=true",
						"RCLONE_CONFIG_SRC_REGION=us-east-1"}
					dropCaches(b)
					start := time.Now()
					rss, cpu := run(b, env, rclone, "copy", "--transfers", "16", "src:"+bucket, filepath.Join(dst, "copy"))
					syncfs(b, dst)
					rcs = append(rcs, time.Since(start))
					rcRSS, rcCPUs = max(rcRSS, rss), append(rcCPUs, cpu)
					checkCopy(b, "rclone", filepath.Join(dst, "copy"), sh)
				}},
				{"transfer manager", func() {
					dst, done := fresh("transfermanager")
					defer done()
					tm := copyChild(b, "transfer-manager", s, map[string]string{
						"endpoint": s.Endpoint, "bucket": bucket, "dest": filepath.Join(dst, "copy")}, "CISTERN_BENCH_CPUPROFILE="+tmProfile)
					tms = append(tms, seconds(tm.OutsideSeconds))
					tmRSS, tmCPUs = max(tmRSS, tm.MaxRSSBytes), append(tmCPUs, tm.CPUSeconds)
					checkCopy(b, "transfer manager", filepath.Join(dst, "copy"), sh)
				}},
				{"awscli", func() {
					// Its own config file, the test credentials in the environment, no instance
					// metadata lookups, and the endpoint given on the command line: it talks to
					// the local server only.
					dst, done := fresh("awscli")
					defer done()
					env := []string{"AWS_CONFIG_FILE=" + awsConfig, "AWS_SHARED_CREDENTIALS_FILE=/dev/null", "AWS_PROFILE=default",
						"AWS_ACCESS_KEY_ID=" + s.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s.SecretKey, "AWS_DEFAULT_REGION=us-east-1",
						"AWS_EC2_METADATA_DISABLED=true", "AWS_PAGER="}
					dropCaches(b)
					start := time.Now()
					rss, cpu := run(b, env, awscli, "s3", "cp", "--recursive", "--only-show-errors", "--no-progress",
						"--endpoint-url", s.Endpoint, "s3://"+bucket, filepath.Join(dst, "copy"))
					syncfs(b, dst)
					awss = append(awss, time.Since(start))
					awsRSS, awsCPUs = max(awsRSS, rss), append(awsCPUs, cpu)
					checkCopy(b, "awscli", filepath.Join(dst, "copy"), sh)
				}},
				{"Cistern", func() {
					dst, done := fresh("cistern")
					defer done()
					res = stageChild(b, s, bucket, dst, profile)
					trees, _ := filepath.Glob(filepath.Join(dst, "pool", datasource.CacheDirName, "*", "tree"))
					if len(trees) != 1 {
						b.Fatalf("Cistern: %d staged trees in its pool, want 1", len(trees))
					}
					checkCopy(b, "Cistern", trees[0], sh)
					ress = append(ress, res)
					stages = append(stages, seconds(res.OutsideSeconds))
				}},
			}
			order.Shuffle(len(copiers), func(i, j int) { copiers[i], copiers[j] = copiers[j], copiers[i] })
			var names []string
			for _, c := range copiers {
				c.run()
				names = append(names, c.name)
			}
			b.Logf("%s, run %d: order %s", sh.name, r+1, strings.Join(names, ", "))
			b.Logf("%s, run %d: cp -r %s, rclone %s, transfer manager %s, awscli %s, Cistern %s", sh.name, r+1,
				round(cps[r]), round(rcs[r]), round(tms[r]), round(awss[r]), round(stages[r]))
		}
		load = fmt.Sprintf("%s → %s", load, loadAverage())
		cpTime, rcTime, tmTime, awsTime, stage := median(cps), median(rcs), median(tms), median(awss), median(stages)
		hit := median(collect(ress, func(r childResult) time.Duration { return seconds(r.HitSeconds) }))
		fullHit := median(collect(ress, func(r childResult) time.Duration { return seconds(r.FullHitSeconds) }))
		pop := median(collect(ress, func(r childResult) time.Duration { return seconds(r.PopulateSeconds) }))
		cpu := median(collect(ress, func(r childResult) time.Duration { return seconds(r.CPUSeconds) }))
		rcCPU, tmCPU, awsCPU := median(collect(rcCPUs, seconds)), median(collect(tmCPUs, seconds)), median(collect(awsCPUs, seconds))
		var rss int64
		for _, r := range ress {
			rss = max(rss, r.MaxRSSBytes)
		}
		// The goal is set against the fastest of the S3 copiers users would run instead.
		fastest, fastestName := rcTime, "rclone"
		if tmTime < fastest {
			fastest, fastestName = tmTime, "transfer manager"
		}
		if awsTime < fastest {
			fastest, fastestName = awsTime, "awscli"
		}
		ratio := func(d time.Duration) string { return fmt.Sprintf("%.2f", stage.Seconds()/d.Seconds()) }
		cells := []string{sh.name, round(stage).String(), round(rcTime).String(), round(tmTime).String(),
			round(awsTime).String(), round(cpTime).String(), ratio(rcTime), ratio(tmTime), ratio(awsTime),
			ratio(fastest) + " (" + fastestName + ")", ratio(cpTime),
			hit.Round(10 * time.Microsecond).String(), fmt.Sprintf("%.4f%%", 100*hit.Seconds()/stage.Seconds()),
			fullHit.Round(10 * time.Microsecond).String(), fmt.Sprintf("%.2f%%", 100*fullHit.Seconds()/stage.Seconds()),
			round(pop).String(), mib(rss), mib(rcRSS), mib(tmRSS), mib(awsRSS),
			fmt.Sprintf("%.1fs", cpu.Seconds()), fmt.Sprintf("%.1fs", rcCPU.Seconds()),
			fmt.Sprintf("%.1fs", tmCPU.Seconds()), fmt.Sprintf("%.1fs", awsCPU.Seconds()), load}
		row := fmt.Sprintf("| %s |\n", strings.Join(cells, " | "))
		b.Logf("%s", row)
		report.WriteString(row)
		verdict := "met"
		if stage > fastest {
			verdict = "NOT met"
		}
		verdicts = append(verdicts, fmt.Sprintf("%s: Cistern %s, fastest of the three %s (%s): ratio %.3f, goal <= 1.0 %s",
			sh.name, stage.Round(time.Millisecond), fastest.Round(time.Millisecond), fastestName, stage.Seconds()/fastest.Seconds(), verdict))
		os.RemoveAll(work)
		if !reuse {
			os.RemoveAll(filepath.Join(s.Dir, bucket))
		}
	}
	fmt.Fprintf(&report, "\n(%s, %d CPUs; medians of %d runs; peak RSS is the highest; page cache %s)\n",
		time.Now().UTC().Format("2006-01-02"), cpus(), reps, cacheMode())
	for _, v := range verdicts {
		fmt.Fprintf(&report, "\n%s", v)
	}
	report.WriteString("\n")
	b.Logf("\n%s", report.String())
	if out := os.Getenv("CISTERN_BENCH_OUT"); out != "" {
		os.WriteFile(out, []byte(report.String()), 0o644)
	}
}

// stageChild stages bucket in a child process standing for the driver, into a pool on fs.
func stageChild(b *testing.B, s *testpeers.S3, bucket, fs, profile string) childResult {
	pool := filepath.Join(fs, "pool")
	popDst := filepath.Join(fs, "volume")
	os.MkdirAll(pool, 0o755)
	os.MkdirAll(popDst, 0o755)
	return copyChild(b, "staging", s, map[string]string{"source": "s3://" + bucket, "endpoint": s.Endpoint, "pathStyle": "true"},
		"CISTERN_BENCH_POOL="+pool, "CISTERN_BENCH_POPULATE="+popDst, "CISTERN_BENCH_CPUPROFILE="+profile)
}

// copyChild runs child name (TestMain's) with params and the server's credentials, and returns
// what it reports; it fails the benchmark if the child fails.
func copyChild(b *testing.B, name string, s *testpeers.S3, params map[string]string, env ...string) childResult {
	p, _ := json.Marshal(params)
	dropCaches(b)
	cmd := testutil.ChildCommand(name, append([]string{"CISTERN_BENCH_PARAMS=" + string(p),
		"CISTERN_BENCH_AK=" + s.AccessKey, "CISTERN_BENCH_SK=" + s.SecretKey}, env...)...)
	pr, pw, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	pw.Close()
	var out bytes.Buffer
	var outside time.Duration
	sc := bufio.NewScanner(pr)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		if sc.Text() == stagedLine && outside == 0 {
			outside = time.Since(start)
		}
		out.Write(sc.Bytes())
		out.WriteByte('\n')
	}
	pr.Close()
	if err := cmd.Wait(); err != nil {
		b.Fatalf("%s: %v\n%s", name, err, tail(out.Bytes()))
	}
	var res childResult
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, "RESULT ") {
			json.Unmarshal([]byte(strings.TrimPrefix(line, "RESULT ")), &res)
		}
	}
	if res.StageSeconds == 0 || outside == 0 {
		b.Fatalf("no result from %s:\n%s", name, tail(out.Bytes()))
	}
	res.OutsideSeconds = outside.Seconds()
	return res
}

// writeAWSConfig writes awscli's config for the benchmark, tuned as its S3 configuration guide
// says for throughput: more concurrent requests (default 10), a deeper task queue so 20,000
// objects are queued ahead (default 1,000), and larger parts for multipart downloads (its
// example's 64 MB threshold and 16 MB chunks; default 8 MB).
func writeAWSConfig(b *testing.B, dir string) string {
	path := filepath.Join(dir, "aws-config")
	conf := fmt.Sprintf("[default]\nregion = us-east-1\ns3 =\n  max_concurrent_requests = %d\n  max_queue_size = 10000\n"+
		"  multipart_threshold = 64MB\n  multipart_chunksize = 16MB\n  addressing_style = path\n", peerConcurrency)
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		b.Fatal(err)
	}
	return path
}

// checkCopy fails the benchmark unless dir holds exactly the dataset's objects, by count and
// size: a copier that exits 0 having skipped or truncated files must not post a fast time.
func checkCopy(b *testing.B, copier, dir string, sh shape) {
	files, bytes, err := testutil.TreeSize(dir)
	if err != nil {
		b.Fatalf("%s: %v", copier, err)
	}
	if files != int64(sh.objects) || bytes != int64(sh.objects)*sh.size {
		b.Fatalf("%s copied %d files, %d bytes; want %d files, %d bytes", copier, files, bytes, sh.objects, int64(sh.objects)*sh.size)
	}
}

func mib(n int64) string { return fmt.Sprintf("%d MiB", n>>20) }

// freshFS mounts a new ext4 filesystem at dir/name, in an image file in dir: on the same disk as
// the S3 server's data, with a journal as a node's pool filesystem has. A fresh one per copier
// makes runs comparable: on a filesystem where many files were just deleted, creating files can
// cost several times more (ext4 without a journal skips recently freed inodes, and this test
// machine's root filesystem has none). Without root, it falls back to a directory.
func freshFS(b *testing.B, dir, name string, size int64) (string, func()) {
	mnt := filepath.Join(dir, name)
	img := mnt + ".img"
	os.MkdirAll(mnt, 0o755)
	fallback := func(err error) (string, func()) {
		b.Logf("no fresh filesystem (%v); copying into a directory", err)
		return mnt, func() { os.RemoveAll(mnt) }
	}
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		return fallback(err)
	}
	if err := os.Truncate(img, size); err != nil {
		return fallback(err)
	}
	out, err := exec.Command("losetup", "--direct-io=on", "--find", "--show", img).CombinedOutput()
	if err != nil {
		os.Remove(img)
		return fallback(fmt.Errorf("losetup: %v: %s", err, out))
	}
	dev := strings.TrimSpace(string(out))
	// Once only: a loop device detached twice may by then be someone else's.
	undo := sync.OnceFunc(func() {
		exec.Command("umount", mnt).Run()
		exec.Command("losetup", "-d", dev).Run()
		os.Remove(img)
		os.RemoveAll(mnt)
	})
	// No lazy initialization: a background thread zeroing inode tables would disturb the copy.
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev).CombinedOutput(); err != nil {
		undo()
		b.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	if out, err := exec.Command("mount", dev, mnt).CombinedOutput(); err != nil {
		undo()
		b.Fatalf("mount: %v: %s", err, out)
	}
	b.Cleanup(undo)
	return mnt, undo
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func collect[T any](in []T, f func(T) time.Duration) []time.Duration {
	out := make([]time.Duration, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// loadAverage is the 1-minute load average: the machine may be shared, and figures mean more
// with it.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

func round(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }

func tail(b []byte) string {
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func cpus() int {
	var set unix.CPUSet
	unix.SchedGetaffinity(0, &set)
	return set.Count()
}

func cacheMode() string {
	if os.Getenv("CISTERN_BENCH_DROP_CACHES") != "" {
		return "dropped before each copy"
	}
	return "warm (set CISTERN_BENCH_DROP_CACHES=1 to drop it before each copy)"
}

// dropCaches empties the page cache when asked, so every copy reads from the disk.
func dropCaches(b *testing.B) {
	unix.Sync()
	if os.Getenv("CISTERN_BENCH_DROP_CACHES") != "" {
		if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200); err != nil {
			b.Fatal(err)
		}
	}
}

func syncfs(t testing.TB, dir string) {
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// peakRSS reads a process's high-water resident set size (VmHWM). getrusage's maxrss is no
// use here: it survives exec, so a child started by a large parent reports the parent's size.
func peakRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
			return kb << 10
		}
	}
	return 0
}

// run runs a command and returns its peak RSS, sampled while it runs, and its CPU time.
func run(b *testing.B, env []string, name string, args ...string) (int64, float64) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var peak int64
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				b.Fatalf("%s: %v\n%s", name, err, out.String())
			}
			return peak, (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
		case <-t.C:
			peak = max(peak, peakRSS(cmd.Process.Pid))
		}
	}
}

// upload fills a bucket with pseudo-random objects, in parallel.
func upload(b *testing.B, s *testpeers.S3, bucket string, sh shape) {
	if sh.partSize > 0 {
		for i := range sh.objects {
			s.PutMultipart(b, bucket, sh.key(i), sh.size, sh.partSize, func(p int, buf []byte) { fill(buf, uint64(i*1000+p)) })
		}
		return
	}
	var wg sync.WaitGroup
	work := make(chan int)
	workers := 16
	if sh.size >= 16<<20 {
		workers = 4
	}
	for range workers {
		wg.Go(func() {
			buf := make([]byte, sh.size)
			for i := range work {
				fill(buf, uint64(i))
				if _, err := s.Client.PutObject(context.Background(), &s3.PutObjectInput{
					Bucket: aws.String(bucket), Key: aws.String(sh.key(i)), Body: bytes.NewReader(buf),
				}); err != nil {
					b.Error(err)
				}
			}
		})
	}
	for i := range sh.objects {
		work <- i
	}
	close(work)
	wg.Wait()
}

// fill writes cheap, incompressible-enough bytes (xorshift).
func fill(buf []byte, seed uint64) {
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := 0; i+8 <= len(buf); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		for k := range 8 {
			buf[i+k] = byte(x >> (8 * k))
		}
	}
}
