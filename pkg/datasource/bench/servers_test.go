package bench

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// serverShape is the dataset of the per-server cases: small enough for Ceph RGW's in-memory OSD
// (1 GiB) and a few minutes per server, large enough that the copy, not process start, dominates.
var serverShape = shape{name: "100 × 8 MiB", objects: 100, size: 8 << 20,
	key: func(i int) string { return fmt.Sprintf("shard-%03d.bin", i) }}

// s3Server is one S3 implementation the per-server cases stage from.
type s3Server struct {
	name string
	// rcloneProvider is rclone's name for it (the provider option selects rclone's quirks for
	// that server, as a user configuring rclone for it would).
	rcloneProvider string
	// start runs the server under dir until the sub-benchmark ends; a missing program fails the
	// benchmark under CISTERN_REQUIRE_PEERS.
	start func(b *testing.B, dir string) *testpeers.S3
}

var s3Servers = []s3Server{
	{"versitygw", "Other", func(b *testing.B, dir string) *testpeers.S3 {
		return testpeers.StartS3(b, filepath.Join(dir, "versitygw"))
	}},
	{"seaweedfs", "SeaweedFS", func(b *testing.B, dir string) *testpeers.S3 {
		w, err := testpeers.StartSeaweedFS(context.Background(), testpeers.Binary(b, "CISTERN_SEAWEEDFS"), dir)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(w.Close)
		b.Logf("seaweedfs: set up in %s", w.Setup.Round(100*time.Millisecond))
		return w.S3
	}},
	{"rgw", "Ceph", func(b *testing.B, dir string) *testpeers.S3 {
		if err := testpeers.RGWAvailable(); err != nil {
			testutil.Unavailable(b, "%v", err)
		}
		r, err := testpeers.StartRGW(context.Background(), dir)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(r.Close)
		b.Logf("rgw: set up in %s", r.Setup.Round(100*time.Millisecond))
		return r.S3
	}},
}

// BenchmarkStagingServers stages one dataset from each S3 server with Cistern and with rclone
// (the baseline), taking turns in a seeded random order, CISTERN_BENCH_REPS times each (default
// 3), every copy checked byte for byte against the uploaded data. It prints one
// `datasource-server:` line per server and copier, and a table for docs/benchmarks.md.
func BenchmarkStagingServers(b *testing.B) {
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("CISTERN_BENCH_SEED"), 10, 64); err == nil {
		seed = v
	}
	b.Logf("copier order seed %d (CISTERN_BENCH_SEED)", seed)
	order := rand.New(rand.NewPCG(seed, 0))
	reps := 3
	if n, err := strconv.Atoi(os.Getenv("CISTERN_BENCH_REPS")); err == nil && n > 0 {
		reps = n
	}
	rclone := testpeers.Binary(b, "CISTERN_RCLONE")
	want := expectedDigests(serverShape)
	var rows []string
	for _, srv := range s3Servers {
		b.Run(srv.name, func(b *testing.B) {
			rows = append(rows, stageFromServer(b, srv, rclone, reps, order, want))
		})
	}
	b.Logf("\n| server | Cistern min / median / max | rclone min / median / max | Cistern / rclone (medians) | load average |\n"+
		"| --- | --- | --- | --- | --- |\n%s\n(%s, %s, %d CPUs, %d runs each, page cache %s)",
		strings.Join(rows, "\n"), serverShape.name, time.Now().UTC().Format("2006-01-02"), cpus(), reps, cacheMode())
}

// stageFromServer is one server's case: it starts the server, uploads the dataset and times
// both copiers reps times. It returns the case's row of the table.
func stageFromServer(b *testing.B, srv s3Server, rclone string, reps int, order *rand.Rand, want map[string][sha256.Size]byte) string {
	base := b.TempDir()
	s := srv.start(b, base)
	const bucket = "bench-servers"
	s.Bucket(b, bucket)
	upStart := time.Now()
	upload(b, s, bucket, serverShape)
	b.Logf("%s: uploaded %s in %s", srv.name, serverShape.name, round(time.Since(upStart)))
	fsSize := 2*int64(serverShape.objects)*serverShape.size + 1<<30
	fresh := func(name string) (string, func()) { return freshFS(b, base, name, fsSize) }
	var cisterns, rclones []time.Duration
	loadBefore := loadAverage()
	for r := range reps {
		copiers := []struct {
			name string
			run  func()
		}{
			{"rclone", func() {
				dst, done := fresh("rclone")
				defer done()
				env := []string{"RCLONE_CONFIG=/dev/null", "RCLONE_CONFIG_SRC_TYPE=s3",
					"RCLONE_CONFIG_SRC_PROVIDER=" + srv.rcloneProvider, "RCLONE_CONFIG_SRC_ENDPOINT=" + s.Endpoint,
					"RCLONE_CONFIG_SRC_ACCESS_KEY_ID=" + s.AccessKey, "RCLONE_CONFIG_SRC_SECRET_ACCESS_KEY=" + s.SecretKey,
					"RCLONE_CONFIG_SRC_FORCE_PATH_STYLE=true", "RCLONE_CONFIG_SRC_REGION=us-east-1"}
				dropCaches(b)
				start := time.Now()
				run(b, env, rclone, "copy", "--transfers", strconv.Itoa(peerConcurrency), "src:"+bucket, filepath.Join(dst, "copy"))
				syncfs(b, dst)
				rclones = append(rclones, time.Since(start))
				checkIdentical(b, srv.name+": rclone", filepath.Join(dst, "copy"), want)
			}},
			{"Cistern", func() {
				dst, done := fresh("cistern")
				defer done()
				pool := filepath.Join(dst, "pool")
				os.MkdirAll(pool, 0o755)
				res := copyChild(b, "staging", s, map[string]string{"source": "s3://" + bucket, "endpoint": s.Endpoint, "pathStyle": "true"},
					"CISTERN_BENCH_POOL="+pool)
				cisterns = append(cisterns, seconds(res.OutsideSeconds))
				trees, _ := filepath.Glob(filepath.Join(pool, datasource.CacheDirName, "*", "tree"))
				if len(trees) != 1 {
					b.Fatalf("%s: Cistern: %d staged trees in its pool, want 1", srv.name, len(trees))
				}
				checkIdentical(b, srv.name+": Cistern", trees[0], want)
			}},
		}
		order.Shuffle(len(copiers), func(i, j int) { copiers[i], copiers[j] = copiers[j], copiers[i] })
		for _, c := range copiers {
			c.run()
		}
		b.Logf("%s, run %d: %s first; Cistern %s, rclone %s", srv.name, r+1, copiers[0].name, round(cisterns[r]), round(rclones[r]))
	}
	load := fmt.Sprintf("load_before=%s load_after=%s", loadBefore, loadAverage())
	ratio := median(cisterns).Seconds() / median(rclones).Seconds()
	fmt.Printf("datasource-server: server=%s dataset=%q copier=rclone %s %s\n", srv.name, serverShape.name, sampleFields(rclones), load)
	fmt.Printf("datasource-server: server=%s dataset=%q copier=cistern %s baseline=rclone ratio_median=%.2f %s\n",
		srv.name, serverShape.name, sampleFields(cisterns), ratio, load)
	return fmt.Sprintf("| %s | %s | %s | %.2f | %s → %s |", srv.name, minMedMax(cisterns), minMedMax(rclones), ratio, loadBefore, loadAverage())
}

// sampleFields is n, min, median and max of samples as key=value pairs.
func sampleFields(d []time.Duration) string {
	return fmt.Sprintf("n=%d min=%s median=%s max=%s", len(d), round(slices.Min(d)), round(median(d)), round(slices.Max(d)))
}

func minMedMax(d []time.Duration) string {
	return fmt.Sprintf("%s / %s / %s", round(slices.Min(d)), round(median(d)), round(slices.Max(d)))
}

// expectedDigests is the SHA-256 of each object upload writes for sh, by key.
func expectedDigests(sh shape) map[string][sha256.Size]byte {
	want := make(map[string][sha256.Size]byte, sh.objects)
	buf := make([]byte, sh.size)
	for i := range sh.objects {
		fill(buf, uint64(i))
		want[sh.key(i)] = sha256.Sum256(buf)
	}
	return want
}

// checkIdentical fails the benchmark unless dir holds exactly the dataset (identical).
func checkIdentical(b *testing.B, copier, dir string, want map[string][sha256.Size]byte) {
	if err := identical(dir, want); err != nil {
		b.Fatalf("%s copied the dataset wrong: %v", copier, err)
	}
}

// identical reports how dir differs from want (its objects' SHA-256 by key), or nil when it holds
// exactly those objects with the same bytes: a fast copy of the wrong data, or of part of it, is
// no result.
func identical(dir string, want map[string][sha256.Size]byte) error {
	seen := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		sum, ok := want[filepath.ToSlash(rel)]
		if !ok || !d.Type().IsRegular() {
			return fmt.Errorf("%s: not an object of the dataset (%s)", rel, d.Type())
		}
		got, err := fileDigest(path)
		if err != nil {
			return err
		}
		if got != sum {
			return fmt.Errorf("%s: SHA-256 %x, uploaded %x", rel, got, sum)
		}
		seen++
		return nil
	})
	if err == nil && seen != len(want) {
		err = fmt.Errorf("%d of the %d objects", seen, len(want))
	}
	return err
}

func fileDigest(path string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	f, err := os.Open(path)
	if err != nil {
		return sum, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return sum, err
	}
	copy(sum[:], h.Sum(nil))
	return sum, nil
}
