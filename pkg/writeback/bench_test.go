//go:build bench

// A benchmark written as a test (it needs a *testing.T's helpers and subtests): built only
// with -tags bench, by make bench-writeback.

package writeback_test

import (
	"context"
	"fmt"
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
// write-back), each into a fresh bucket of the same versitygw, 3 samples each side by side, and
// prints min/median/max and the ratio of the medians to the fastest peer. CISTERN_WRITEBACK_SCALE
// divides the sizes (the single file) and counts (the others) for a smaller machine.
func TestBenchWriteback(t *testing.T) {
	scale, _ := strconv.Atoi(os.Getenv("CISTERN_WRITEBACK_SCALE"))
	scale = max(scale, 1)
	rclone := testpeers.Binary(t, "CISTERN_RCLONE")
	s := testpeers.StartS3(t, "")
	cases := []benchCase{{"2GiB-x1", 1, (2 << 30) / scale}, {"64MiB-x100", 100 / scale, 64 << 20}, {"32KiB-x20000", 20000 / scale, 32 << 10}}
	for _, c := range cases {
		dir := t.TempDir()
		var total int64
		for i := range c.count {
			writeFile(t, filepath.Join(dir, fmt.Sprintf("d%02d/f%05d", i%50, i)), randBytes(uint64(i+1), c.size))
			total += int64(c.size)
		}
		var ours, rc, tm []time.Duration
		var sent int64
		for r := range 3 {
			b := strings.ToLower(fmt.Sprintf("%s-%d", c.name, r))
			ours = append(ours, timed(t, s, "wb-"+b, func(bucket string) {
				u, err := writeback.New(writeback.Config{Dir: t.TempDir()})
				if err != nil {
					t.Fatal(err)
				}
				var last writeback.Progress
				if err := u.Run(context.Background(), writeback.Job{Volume: bucket, Upper: dir, Target: writeback.Target{Bucket: bucket}}, s.Client,
					func(p writeback.Progress) { last = p }); err != nil {
					t.Fatal(err)
				}
				sent = last.Sent
			}))
			rc = append(rc, timed(t, s, "rc-"+b, func(bucket string) {
				cmd := exec.Command(rclone, "copy", "--transfers", "16", dir, "dst:"+bucket)
				cmd.Env = append(os.Environ(), "RCLONE_CONFIG=/dev/null", "RCLONE_CONFIG_DST_TYPE=s3", "RCLONE_CONFIG_DST_PROVIDER=Other",
					"RCLONE_CONFIG_DST_ENDPOINT="+s.Endpoint, "RCLONE_CONFIG_DST_ACCESS_KEY_ID="+s.AccessKey,
					"RCLONE_CONFIG_DST_SECRET_ACCESS_KEY="+s.SecretKey, "RCLONE_CONFIG_DST_FORCE_PATH_STYLE=true", "RCLONE_CONFIG_DST_REGION=us-east-1")
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("rclone: %v: %s", err, out)
				}
			}))
			tm = append(tm, timed(t, s, "tm-"+b, func(bucket string) {
				m := transfermanager.New(s.Client, func(o *transfermanager.Options) { o.Concurrency = 16; o.PartSizeBytes = 16 << 20 })
				out, err := m.UploadDirectory(context.Background(), &transfermanager.UploadDirectoryInput{
					Bucket: aws.String(bucket), Source: aws.String(dir), Recursive: aws.Bool(true)})
				if err != nil || out.ObjectsFailed != 0 {
					t.Fatalf("transfer manager: %v, %+v", err, out)
				}
			}))
		}
		fastest := min(median(rc), median(tm))
		unpublish := "n/a"
		if c.count == 1 {
			unpublish = unpublishRatio(t)
		}
		fmt.Printf("writeback: output=%s upload_ratio=%.2f unpublish_ratio=%s bytes_ratio=%.3f  (Cistern %s, rclone %s, transfer manager %s; min/median/max, scale 1/%d)\n",
			c.name, median(ours).Seconds()/fastest.Seconds(), unpublish, float64(sent)/float64(total), spread(ours), spread(rc), spread(tm), scale)
		if err := os.RemoveAll(dir); err != nil { // the disk is shared: one case's files at a time
			t.Fatal(err)
		}
	}
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

// timed creates bucket, times upload into it, and deletes what it holds after.
func timed(t *testing.T, s *testpeers.S3, bucket string, upload func(bucket string)) time.Duration {
	s.Bucket(t, bucket)
	start := time.Now()
	upload(bucket)
	d := time.Since(start)
	if err := os.RemoveAll(filepath.Join(s.Dir, bucket)); err != nil {
		t.Fatal(err)
	}
	return d
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
