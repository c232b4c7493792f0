//go:build bench

// A benchmark written as a test (it needs a *testing.T's helpers and subtests): built only
// with -tags bench, by make bench-writeback.

package writeback_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager"

	"github.com/cistern-csi/cistern/pkg/writeback"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// benchCase is one output of the benchmark: count files of size bytes.
type benchCase struct {
	name        string
	count, size int
}

// TestBenchWriteback (make bench-writeback) uploads each output with the write-back, rclone copy
// --transfers 16 and the transfer manager's UploadDirectory (16 in flight, 16 MiB parts, as the
// write-back), each into a fresh bucket of the same versitygw, 3 rounds, the copiers' order drawn
// anew each round (CISTERN_BENCH_SEED, or the clock; logged), and checks every copy against the
// files, byte for byte, as the server stored them. It prints min/median/max and the ratio of the
// medians to the fastest peer. bytes_ratio is from the write-back's second job of each round: the
// first one kept (Keep), 1% of the files rewritten (one at least), the job run again through a
// proxy that counts the request body bytes the server receives, over the changed files' size.
// CISTERN_WRITEBACK_SCALE divides the sizes (the single file) and counts (the others) for a
// smaller machine.
func TestBenchWriteback(t *testing.T) {
	scale, _ := strconv.Atoi(os.Getenv("CISTERN_WRITEBACK_SCALE"))
	scale = max(scale, 1)
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("CISTERN_BENCH_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("copier order seed %d (CISTERN_BENCH_SEED)", seed)
	order := rand.New(rand.NewPCG(seed, 0))
	rclone := testpeers.Binary(t, "CISTERN_RCLONE")
	s := testpeers.StartS3(t, "")
	proxy := testpeers.StartProxy(t, s.Endpoint, nil)
	counted := clientFor(s, proxy.URL)
	cases := []benchCase{{"2GiB-x1", 1, (2 << 30) / scale}, {"64MiB-x100", 100 / scale, 64 << 20}, {"32KiB-x20000", 20000 / scale, 32 << 10}}
	for _, c := range cases {
		dir := t.TempDir()
		var paths []string
		for i := range c.count {
			p := fmt.Sprintf("d%02d/f%05d", i%50, i)
			writeFile(t, filepath.Join(dir, p), randBytes(uint64(i+1), c.size))
			paths = append(paths, p)
		}
		times := map[string][]time.Duration{}
		var second []time.Duration
		var ratios []float64
		changes := max(1, c.count/100)
		for r := range 3 {
			jobs := map[string]*writeback.Uploader{}
			copiers := []struct {
				name   string
				upload func(bucket string)
				// after, when set, runs once the copy is verified, before the bucket is emptied.
				after func(bucket string)
			}{
				{"wb", func(bucket string) {
					u, job := writebackJob(t, dir, bucket)
					if err := u.Run(context.Background(), job, s.Client, nil); err != nil {
						t.Fatal(err)
					}
					jobs[bucket] = u
				}, func(bucket string) {
					// The second job, untimed among the copiers: the volume kept, 1% of its
					// files changed, the job run again through the counting proxy.
					u := jobs[bucket]
					_, job := writebackJob(t, dir, bucket)
					if err := u.Keep(job.Volume); err != nil {
						t.Fatal(err)
					}
					var changed int64
					for _, i := range order.Perm(len(paths))[:changes] {
						b := randBytes(seed+uint64(r*c.count+i)<<1|1, c.size)
						writeFile(t, filepath.Join(dir, paths[i]), b)
						changed += int64(len(b))
					}
					if err := u.Add(job); err != nil {
						t.Fatal(err)
					}
					before := proxy.Received.Load()
					start := time.Now()
					if err := u.Run(context.Background(), job, counted, nil); err != nil {
						t.Fatal(err)
					}
					second = append(second, time.Since(start))
					ratios = append(ratios, float64(proxy.Received.Load()-before)/float64(changed))
					verifyCopy(t, filepath.Join(s.Dir, bucket), dir)
				}},
				{"rc", func(bucket string) {
					cmd := exec.Command(rclone, "copy", "--transfers", "16", dir, "dst:"+bucket)
					cmd.Env = append(os.Environ(), "RCLONE_CONFIG=/dev/null", "RCLONE_CONFIG_DST_TYPE=s3", "RCLONE_CONFIG_DST_PROVIDER=Other",
						"RCLONE_CONFIG_DST_ENDPOINT="+s.Endpoint, "RCLONE_CONFIG_DST_ACCESS_KEY_ID="+s.AccessKey,
						"RCLONE_CONFIG_DST_SECRET_ACCESS_KEY="+s.SecretKey, "RCLONE_CONFIG_DST_FORCE_PATH_STYLE=true", "RCLONE_CONFIG_DST_REGION=us-east-1")
					if out, err := cmd.CombinedOutput(); err != nil {
						t.Fatalf("rclone: %v: %s", err, out)
					}
				}, nil},
				{"tm", func(bucket string) {
					m := transfermanager.New(s.Client, func(o *transfermanager.Options) { o.Concurrency = 16; o.PartSizeBytes = 16 << 20 })
					out, err := m.UploadDirectory(context.Background(), &transfermanager.UploadDirectoryInput{
						Bucket: aws.String(bucket), Source: aws.String(dir), Recursive: aws.Bool(true)})
					if err != nil || out.ObjectsFailed != 0 {
						t.Fatalf("transfer manager: %v, %+v", err, out)
					}
				}, nil},
			}
			order.Shuffle(len(copiers), func(i, j int) { copiers[i], copiers[j] = copiers[j], copiers[i] })
			var names []string
			for _, cp := range copiers {
				names = append(names, cp.name)
			}
			t.Logf("%s, round %d: order %s", c.name, r+1, strings.Join(names, ", "))
			for _, cp := range copiers {
				bucket := strings.ToLower(fmt.Sprintf("%s-%s-%d", cp.name, c.name, r))
				times[cp.name] = append(times[cp.name], timed(t, s, bucket, dir, cp.upload, cp.after))
			}
		}
		ours, rc, tm := times["wb"], times["rc"], times["tm"]
		fastest := min(median(rc), median(tm))
		unpublish := "n/a"
		if c.count == 1 {
			unpublish = unpublishRatio(t)
		}
		slices.Sort(ratios)
		fmt.Printf("writeback: output=%s upload_ratio=%.2f unpublish_ratio=%s bytes_ratio=%.3f  (Cistern %s, rclone %s, transfer manager %s; "+
			"second job, %d of %d files changed: %s, bytes received over changed %.3f/%.3f/%.3f; min/median/max, scale 1/%d)\n",
			c.name, median(ours).Seconds()/fastest.Seconds(), unpublish, ratios[len(ratios)/2], spread(ours), spread(rc), spread(tm),
			changes, c.count, spread(second), ratios[0], ratios[len(ratios)/2], ratios[len(ratios)-1], scale)
		if err := os.RemoveAll(dir); err != nil { // the disk is shared: one case's files at a time
			t.Fatal(err)
		}
	}
}

// writebackJob is an uploader with a journal of its own and the job of dir into bucket.
func writebackJob(t *testing.T, dir, bucket string) (*writeback.Uploader, writeback.Job) {
	u, err := writeback.New(writeback.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return u, writeback.Job{Volume: bucket, Upper: dir, Target: writeback.Target{Bucket: bucket}}
}

// unpublishRatio is the driver's TestBenchUnpublish figure for the single file (NodeUnpublish
// with it written and fsync'd over nothing written), which make bench-writeback runs first and
// leaves in CISTERN_UNPUBLISH_RATIO_FILE; "n/a" without it.
func unpublishRatio(t *testing.T) string {
	f := os.Getenv("CISTERN_UNPUBLISH_RATIO_FILE")
	if f == "" {
		return "n/a"
	}
	b, err := os.ReadFile(f)
	if err != nil {
		t.Logf("no unpublish ratio: %v", err)
		return "n/a"
	}
	return strings.TrimSpace(string(b))
}

// timed creates bucket, times upload into it, checks that the server holds dir's files
// (verifyCopy), runs after (when set), and deletes what the bucket holds.
func timed(t *testing.T, s *testpeers.S3, bucket, dir string, upload, after func(bucket string)) time.Duration {
	s.Bucket(t, bucket)
	start := time.Now()
	upload(bucket)
	d := time.Since(start)
	verifyCopy(t, filepath.Join(s.Dir, bucket), dir)
	if after != nil {
		after(bucket)
	}
	if err := os.RemoveAll(filepath.Join(s.Dir, bucket)); err != nil {
		t.Fatal(err)
	}
	return d
}

// verifyCopy fails unless the objects versitygw stored under stored (its posix back end keeps
// an object as the file of its key) are exactly dir's files, byte for byte.
func verifyCopy(t *testing.T, stored, dir string) {
	t.Helper()
	want := map[string]bool{}
	if err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		want[rel] = true
		if !sameBytes(t, p, filepath.Join(stored, rel)) {
			t.Fatalf("%s: the copy of %s differs", stored, rel)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := filepath.WalkDir(stored, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir // the server's own (uploads in progress)
		}
		if rel, _ := filepath.Rel(stored, p); d.Type().IsRegular() && !want[rel] {
			t.Fatalf("%s: %s is no file of the output", stored, rel)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// sameBytes compares two files a MiB at a time.
func sameBytes(t *testing.T, a, b string) bool {
	fa, err := os.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return false
	}
	defer fb.Close()
	ba, bb := make([]byte, 1<<20), make([]byte, 1<<20)
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, _ := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false
		}
		if ea != nil { // both short, by as much: both ended
			return true
		}
	}
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func spread(d []time.Duration) string {
	s := slices.Clone(d)
	slices.Sort(s)
	return fmt.Sprintf("%.2f/%.2f/%.2fs", s[0].Seconds(), s[len(s)/2].Seconds(), s[len(s)-1].Seconds())
}
