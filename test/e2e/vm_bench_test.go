package e2e_test

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cistern-csi/cistern/test/e2e/cluster"
	"github.com/cistern-csi/cistern/test/testutil"
)

// fetched is what a node's stagings read: from the source (S3) and from peers.
type fetched struct{ source, peer float64 }

var originRe = regexp.MustCompile(`origin="([^"]*)"`)

// fetchedByNode reads every node's cistern_dataset_fetched_bytes_total, summed over datasets.
func (s *scenario) fetchedByNode(b *testing.B) map[string]fetched {
	b.Helper()
	out := map[string]fetched{}
	for name, n := range s.c.Nodes {
		resp, err := http.Get("http://" + n.MetricsAddress + "/metrics")
		if err != nil {
			b.Fatal(err)
		}
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			b.Fatal(err)
		}
		var f fetched
		for _, line := range strings.Split(string(raw), "\n") {
			if !strings.HasPrefix(line, "cistern_dataset_fetched_bytes_total{") {
				continue
			}
			m := originRe.FindStringSubmatch(line)
			fields := strings.Fields(line)
			v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
			if m == nil || err != nil {
				b.Fatalf("node %s: unreadable metric line %q", name, line)
			}
			switch m[1] {
			case "source":
				f.source += v
			case "peer":
				f.peer += v
			}
		}
		out[name] = f
	}
	return out
}

// fetchedSince is what each node read between two readings; nodes that read nothing are left out.
func fetchedSince(before, after map[string]fetched) map[string]fetched {
	out := map[string]fetched{}
	for n, a := range after {
		d := fetched{source: a.source - before[n].source, peer: a.peer - before[n].peer}
		if d.source > 0 || d.peer > 0 {
			out[n] = d
		}
	}
	return out
}

// cpuReading is the CPU seconds, so far, of the run's processes and of the whole machine.
type cpuReading struct {
	drivers, s3, controller float64 // the four node plugins (with the mount and mkfs they ran), versitygw, the workload-controller
	busy                    float64 // all cores, every process and kernel thread (/proc/stat)
}

func (s *scenario) readCPU(s3 *cluster.S3) cpuReading {
	r := cpuReading{s3: procCPU(s3.Pid()), controller: procCPU(s.c.Controller.Pid()), busy: machineBusy()}
	for _, n := range s.c.Nodes {
		r.drivers += procCPU(n.Driver.Pid())
	}
	return r
}

// cpuSince is what each used between two readings.
func cpuSince(a, b cpuReading) cpuReading {
	return cpuReading{drivers: b.drivers - a.drivers, s3: b.s3 - a.s3, controller: b.controller - a.controller, busy: b.busy - a.busy}
}

// procCPU is a process's CPU seconds so far, all its threads and the children it waited for
// (the mount and mkfs a node plugin ran).
func procCPU(pid int) float64 {
	own, children := testutil.ProcCPU(pid)
	return own + children
}

// machineBusy is the CPU seconds all cores spent busy (not idle, not waiting for I/O) since boot.
func machineBusy() float64 {
	_, busy, _, _ := testutil.MachineCPU()
	return busy
}

// vmBytes is one line per run: the MiB each node read from S3 and from peers, and the CPU
// seconds of the run's processes and of the rest of the machine until Running.
func vmBytes(runs []vmRun) string {
	var sb strings.Builder
	cores := float64(runtime.NumCPU())
	for i, r := range runs {
		c := r.cpu
		fmt.Fprintf(&sb, "  run %d, CPU-s: drivers %.2f, S3 %.2f, workload-controller %.2f, rest of the machine %.2f; cores busy %.0f%% of %.2f s\n",
			i+1, c.drivers, c.s3, c.controller, max(0, c.busy-c.drivers-c.s3-c.controller), 100*c.busy/(cores*r.running.Seconds()), r.running.Seconds())
		fmt.Fprintf(&sb, "  run %d, MiB from S3 / from peers:", i+1)
		var s3, peers float64
		for _, n := range slices.Sorted(maps.Keys(r.fetched)) {
			f := r.fetched[n]
			fmt.Fprintf(&sb, " %s %.0f / %.0f,", n, f.source/(1<<20), f.peer/(1<<20))
			s3, peers = s3+f.source, peers+f.peer
		}
		fmt.Fprintf(&sb, " all %.0f / %.0f\n", s3/(1<<20), peers/(1<<20))
	}
	return sb.String()
}

// copyRun is the independent limit of one sample: the same dataset copied from the same server by
// rclone, once alone and three times at once into three directories.
type copyRun struct {
	one, three       time.Duration
	oneCPU, threeCPU float64 // rclone's CPU seconds (user and system), the three copies' summed
	load             string
}

func (c copyRun) ratio() float64 { return c.three.Seconds() / c.one.Seconds() }

// peerCopies copies bucket/prefix with rclone (checksums on: each file's MD5 against the ETag
// after its transfer, and --checksum) from s3, alone, then three at once, each into a directory
// of its own on the disk that holds the nodes' pools, synced (staging makes its files durable),
// and returns both times. The dataset is in the server's page cache as it was for the stagings.
func peerCopies(b *testing.B, rclone string, s3 *cluster.S3, bucket, prefix string) copyRun {
	b.Helper()
	env := append(os.Environ(), "RCLONE_CONFIG=/dev/null", "RCLONE_CONFIG_SRC_TYPE=s3", "RCLONE_CONFIG_SRC_PROVIDER=Other",
		"RCLONE_CONFIG_SRC_ENDPOINT="+s3.Endpoint, "RCLONE_CONFIG_SRC_ACCESS_KEY_ID="+s3.AccessKey,
		"RCLONE_CONFIG_SRC_SECRET_ACCESS_KEY="+s3.SecretKey, "RCLONE_CONFIG_SRC_FORCE_PATH_STYLE=true",
		"RCLONE_CONFIG_SRC_REGION=us-east-1")
	copies := func(n int) (time.Duration, float64) {
		dirs := make([]string, n)
		for i := range dirs {
			dirs[i] = b.TempDir()
		}
		cpu := make([]float64, n)
		took := atOnce(b, n, func(i int) error {
			// As many objects in flight as Cistern's staging reads at once (16), as
			// bench-datasource compares.
			cmd := exec.Command(rclone, "copy", "--checksum", "--transfers", "16", "src:"+bucket+"/"+prefix, dirs[i])
			cmd.Env = env
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("rclone copy: %v: %s", err, out)
			}
			cpu[i] = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
			return syncfs(dirs[i])
		})
		var sum float64
		for i, dir := range dirs {
			checkCopied(b, dir)
			if err := os.RemoveAll(dir); err != nil {
				b.Fatal(err)
			}
			sum += cpu[i]
		}
		return took, sum
	}
	run := copyRun{load: loadAverage()}
	run.one, run.oneCPU = copies(1)
	run.three, run.threeCPU = copies(3)
	return run
}

// checkCopied fails unless dir holds the whole dataset: benchObjects files of benchObjectBytes.
func checkCopied(b *testing.B, dir string) {
	b.Helper()
	files, bytes, err := testutil.TreeSize(dir)
	if err != nil {
		b.Fatal(err)
	}
	if files != benchObjects || bytes != benchObjects*benchObjectBytes {
		b.Fatalf("rclone copied %d files, %d bytes into %s; want %d, %d", files, bytes, dir, benchObjects, benchObjects*benchObjectBytes)
	}
}

func syncfs(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}

// diskWrites is the disk's own limit for one sample: `dd` writing the dataset's size (direct I/O,
// synced, as staging writes large files) once alone, then three times at once, into files on
// the disk that holds the nodes' pools. All four simulated nodes write their copies to that one
// disk.
func diskWrites(b *testing.B) copyRun {
	b.Helper()
	writes := func(n int) time.Duration {
		dir := b.TempDir()
		took := atOnce(b, n, func(i int) error {
			out, err := exec.Command("dd", "if=/dev/zero", "of="+filepath.Join(dir, strconv.Itoa(i)), "bs=4M",
				"count="+strconv.Itoa(benchObjects*benchObjectBytes/(4<<20)), "oflag=direct", "conv=fsync", "status=none").CombinedOutput()
			if err != nil {
				return fmt.Errorf("dd: %v: %s", err, out)
			}
			return nil
		})
		if err := os.RemoveAll(dir); err != nil {
			b.Fatal(err)
		}
		return took
	}
	return copyRun{one: writes(1), three: writes(3), load: loadAverage()}
}

// atOnce runs fn(0), …, fn(n-1) at once and returns how long they took together; an error of
// any fails the benchmark.
func atOnce(b *testing.B, n int, fn func(i int) error) time.Duration {
	b.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Go(func() { errs[i] = fn(i) })
	}
	wg.Wait()
	took := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	return took
}

// vmSamples are the VolumeManager benchmark's samples: per turn, replicas 3's time to Running
// over replicas 1's, rclone's three copies at once over one alone, and the disk's three writes
// at once over one.
type vmSamples struct {
	ready  []float64
	copies []copyRun
	disk   []copyRun
}

func (v vmSamples) readyRatio() string { return strconv.FormatFloat(medianFloat(v.ready), 'f', 2, 64) }

// table is one line per sample, the limit next to the figure.
func (v vmSamples) table() string {
	var sb strings.Builder
	for i := range v.ready {
		c := v.copies[i]
		fmt.Fprintf(&sb, "  sample %d: ready_ratio %.2f; rclone one copy %.2f s (CPU %.2f s), three at once %.2f s (CPU %.2f s), ratio %.2f (load %s)\n",
			i+1, v.ready[i], c.one.Seconds(), c.oneCPU, c.three.Seconds(), c.threeCPU, c.ratio(), c.load)
		if i < len(v.disk) {
			d := v.disk[i]
			fmt.Fprintf(&sb, "    disk: one write %.2f s, three at once %.2f s, ratio %.2f\n", d.one.Seconds(), d.three.Seconds(), d.ratio())
		}
	}
	return sb.String()
}

// line is the summary: the median of each ratio with its min and max.
func (v vmSamples) line() string {
	var copies []float64
	for _, c := range v.copies {
		copies = append(copies, c.ratio())
	}
	var disk []float64
	for _, d := range v.disk {
		disk = append(disk, d.ratio())
	}
	return fmt.Sprintf("ready_ratio=%s peer_three_copies_ratio=%s disk_three_writes_ratio=%s samples=%d", spread(v.ready), spread(copies), spread(disk), len(v.ready))
}

// spread is "median(min-max)", as bench-fanout writes its ratios.
func spread(f []float64) string {
	if len(f) == 0 {
		return "NA"
	}
	return fmt.Sprintf("%.2f(%.2f-%.2f)", medianFloat(f), slices.Min(f), slices.Max(f))
}

func medianFloat(f []float64) float64 {
	if len(f) == 0 {
		return 0
	}
	f = slices.Sorted(slices.Values(f))
	if len(f)%2 == 1 {
		return f[len(f)/2]
	}
	return (f[len(f)/2-1] + f[len(f)/2]) / 2
}
