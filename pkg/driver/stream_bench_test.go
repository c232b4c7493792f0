//go:build bench

// A benchmark written as a test (it needs a *testing.T's helpers and subtests): built only
// with -tags bench, by make bench-streaming.

package driver

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/container-storage-interface/spec/lib/go/csi"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	cparams "github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/volume"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// streamSet is one dataset of the streaming bench: count objects of size bytes under its own
// prefix.
type streamSet struct {
	name  string
	count int
	size  int64
}

func (s streamSet) bytes() int64 { return int64(s.count) * s.size }

// key names object i of the set (the small files spread over 50 directories, as a tree would be).
func (s streamSet) key(i int) string {
	switch {
	case s.count == 1:
		return s.name + "/model.bin"
	case s.size < 1<<20:
		return fmt.Sprintf("%s/d%02d/f%05d.bin", s.name, i%50, i)
	default:
		return fmt.Sprintf("%s/shard-%03d.bin", s.name, i)
	}
}

var streamSets = []streamSet{
	{"model-2g", 1, 2 << 30},
	{"shards-100x64m", 100, 64 << 20},
	// The 20,000: the descriptors streaming volumes hold are bounded
	// (--streaming-max-open-files), below this machine's hard limit of 20,000.
	{"small-20000x32k", 20000, 32 << 10},
	{"model-20g", 1, 20 << 30},
}

// TestStreamingBench (make bench-streaming): the cases of
// issue 25 through the driver, for each dataset, samples interleaved, every baseline measured next
// to its sample from the same versitygw:
//
//   - publish: a static PV's first NodeStageVolume to NodePublishVolume returning (kubelet's
//     retries on Unavailable included; a static PV has no CreateVolume), dataMode streaming, and
//     staged (the full staging) next to it;
//   - read all: right after the streaming publish, walk the volume (find) and read every file in
//     4 MiB chunks, publish to last byte; against the staged volume's publish followed by the same
//     walk and read (for the small files, against the staged publish alone, as the issue
//     asks). The first read of the first file is the first byte, against one 1-byte ranged GET of
//     that object taken just before;
//   - rclone: `rclone mount --vfs-cache-mode full` of the same prefix, from starting it to the last
//     byte of the same walk and read, with an empty cache directory;
//   - cached: once the streaming volume's staging ended, the same walk and read through the
//     streaming volume against on the pool's cached tree directly, each file's pages dropped
//     (fadvise) before each read, the order alternating; cachedPairs pairs per sample.
//
// Every sample is a dataset of its own (an include pattern of its own beside "**"), staged from
// S3 afresh; streaming and staged take turns going first, each starting from an emptied page
// cache, and a streaming volume's staging ends before the staged case starts. versitygw reports
// no per-part checksums, so a streaming read fetches and checks whole objects here.
//
// The S3 server's files, the pool and rclone's cache are on a zram device: each 4 KiB page of the
// data is one repeated 8-byte word (distinct per page), which zram keeps without memory, so a
// 20 GiB object and its cached copies fit on a machine whose disk does not hold them.
//
// CISTERN_BENCH_STREAM_DATASETS picks datasets (default all); CISTERN_BENCH_SAMPLES the samples
// (3); the 20 GiB set measures publish and first byte only unless CISTERN_BENCH_STREAM_20G_READ=1
// (reading it all takes minutes per sample); CISTERN_BENCH_STREAM_RCLONE=0 skips rclone.
// cachedPairs is how many cached reads through the volume, each with one of the pool next to
// it, a sample takes.
const cachedPairs = 3

func TestStreamingBench(t *testing.T) {
	testutil.RequireRoot(t)
	samples := 3
	if n, err := strconv.Atoi(os.Getenv("CISTERN_BENCH_SAMPLES")); err == nil && n > 0 {
		samples = n
	}
	sets := streamSets
	if only := os.Getenv("CISTERN_BENCH_STREAM_DATASETS"); only != "" {
		names := strings.Split(only, ",")
		sets = slices.DeleteFunc(slices.Clone(streamSets), func(s streamSet) bool { return !slices.Contains(names, s.name) })
	}
	rclone := ""
	if os.Getenv("CISTERN_BENCH_STREAM_RCLONE") != "0" {
		rclone = testpeers.Binary(t, "CISTERN_RCLONE")
	}
	// Every case reads from a dropped page cache: on a virtual machine that reports free memory
	// to its host, that memory's first touch is a host fault per page (testutil.HoldGuestMemory).
	held := testutil.HoldGuestMemory(t)
	t.Log(held)
	var lines []string
	for _, set := range sets {
		t.Run(set.name, func(t *testing.T) {
			ls := benchStreamSet(t, set, samples, rclone)
			t.Log(strings.Join(ls, "\n")) // at once too: a later set may not finish
			lines = append(lines, ls...)
		})
	}
	fmt.Println()
	fmt.Println("  " + held)
	for _, l := range lines {
		fmt.Println(l)
	}
}

// streamBench is one dataset's bench: the server, the driver and what each sample measured.
type streamBench struct {
	t       *testing.T
	set     streamSet
	env     *testEnv
	s3      *testpeers.S3
	root    string
	pool    string // the pool's directory
	secrets map[string]string
}

var roMany = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
}

func benchStreamSet(t *testing.T, set streamSet, samples int, rclone string) []string {
	// What is live at most: the object(s) in S3, two cached copies per sample, and one streaming
	// scratch copy or one rclone cache (both freed, with discard, when they go).
	// xfs for the 20 GiB set: versitygw completes a multipart upload by copying its parts, which
	// xfs does by reflink; on ext4 the 20 GiB copy ended in a 500 from the server.
	poolFS := "ext4"
	if set.bytes() > 8<<30 {
		poolFS = "xfs"
	}
	root := zramPool(t, t.TempDir(), poolFS, int64(2*samples+3)*set.bytes()+(4<<30))
	b := &streamBench{t: t, set: set, root: root}
	poolDir := filepath.Join(root, "pool")
	s3Dir := filepath.Join(root, "s3")
	for _, d := range []string{poolDir, s3Dir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b.pool = poolDir
	b.env = startDriver(t, testPool{name: "fast", path: poolDir})
	b.s3 = testpeers.StartS3(t, s3Dir)
	b.s3.Bucket(t, "bench")
	b.secrets = map[string]string{"accessKeyID": b.s3.AccessKey, "secretAccessKey": b.s3.SecretKey}
	start := time.Now()
	b.upload()
	t.Logf("%s: uploaded %d objects, %d MiB, in %s", set.name, set.count, set.bytes()>>20, time.Since(start).Round(time.Millisecond))

	readAll := set.bytes() < 20<<30 || os.Getenv("CISTERN_BENCH_STREAM_20G_READ") == "1"
	var m streamMeasures
	for i := range samples {
		// Streaming and staged, in alternating order, each from an emptied page cache: the
		// first reads of a dataset written with direct I/O allocate its pages, which costs
		// more while other data fills the memory.
		streaming := func() {
			// Publish, then first byte (and the walk and read).
			dropPageCache(t)
			get := b.rangedGet1()
			start, cpu := time.Now(), readCPU(t)
			d, target := b.publish(fmt.Sprintf("stream-%d", i), "streaming")
			m.publish = append(m.publish, d)
			m.get1 = append(m.get1, get)
			if readAll {
				fds := openFiles(t)
				first, all := walkRead(t, target, -1)
				m.firstByte = append(m.firstByte, first)
				m.readAll = append(m.readAll, d+all)
				m.busyReadAll = append(m.busyReadAll, cpu.busySince(t))
				t.Logf("sample %d: %d more descriptors open after reading the streaming volume", i, openFiles(t)-fds)
			} else {
				first, _ := walkRead(t, target, 1)
				m.firstByte = append(m.firstByte, first)
			}
			t.Logf("sample %d: streaming publish %s, first byte %s (1-byte GET %s)", i, d, last(m.firstByte), get)
			b.waitStaged(fmt.Sprintf("stream-%d", i))
			m.bgStaging = append(m.bgStaging, time.Since(start))
			if readAll {
				// Cached: through the streaming volume and on the pool, the order alternating.
				// A cached read of a memory-backed pool varies by ±15% from one read to the
				// next (either path), so each sample takes cachedPairs pairs, each a ratio of
				// its own.
				tree := filepath.Join(cache.DatasetDir(b.pool, b.spec(fmt.Sprintf("stream-%d", i)).ID()), cache.TreeDir)
				for j := range cachedPairs {
					var vol, pool time.Duration
					if (i+j)%2 == 0 {
						vol, pool = coldWalkRead(t, target, b.pool), coldWalkRead(t, tree, b.pool)
					} else {
						pool, vol = coldWalkRead(t, tree, b.pool), coldWalkRead(t, target, b.pool)
					}
					m.cachedVol, m.cachedPool = append(m.cachedVol, vol), append(m.cachedPool, pool)
				}
				// FUSE's own cost, next to a read of the pool: the cached tree through
				// go-fuse's loopback filesystem.
				loop := loopbackRead(t, tree, b.pool)
				m.loopback, m.loopbackPool = append(m.loopback, loop), append(m.loopbackPool, coldWalkRead(t, tree, b.pool))
			}
			b.unpublish(fmt.Sprintf("stream-%d", i))
		}
		staged := func() {
			// The full staging, then the same walk and read.
			dropPageCache(t)
			cpu := readCPU(t)
			s3Before, _ := testutil.ProcCPU(b.s3.Pid())
			d, target := b.publish(fmt.Sprintf("staged-%d", i), "staged")
			m.staged = append(m.staged, d)
			end := readCPU(t)
			s3After, _ := testutil.ProcCPU(b.s3.Pid())
			m.busyStaged = append(m.busyStaged, cpu.busyTo(end))
			m.s3Staged = append(m.s3Staged, (s3After-s3Before)/(end.total-cpu.total))
			if readAll {
				_, all := walkRead(t, target, -1)
				m.stagedAll = append(m.stagedAll, d+all)
				m.busyStagedAll = append(m.busyStagedAll, cpu.busySince(t))
			}
			b.unpublish(fmt.Sprintf("staged-%d", i))
			t.Logf("sample %d: staged publish %s", i, d)
		}
		if i%2 == 0 {
			streaming()
			staged()
		} else {
			staged()
			streaming()
		}

		if rclone != "" && readAll {
			m.rclone = append(m.rclone, b.rcloneRead(rclone, i))
			t.Logf("sample %d: rclone mount to last byte %s", i, last(m.rclone))
		}
	}
	return m.lines(set)
}

type streamMeasures struct {
	publish, staged, get1, firstByte, readAll, stagedAll, rclone, cachedVol, cachedPool []time.Duration
	// bgStaging: from the streaming volume's first NodeStageVolume to its dataset's staging done
	// (the reads above ran meanwhile).
	bgStaging []time.Duration
	// How busy the machine's CPUs were (0-1, all of them) from publish to the last byte read,
	// streaming and staged: where both are near 1, the read all is bound by the CPU work, which
	// a streaming read can only reorder, not overlap.
	busyReadAll, busyStagedAll []float64
	// A cached read through go-fuse's loopback filesystem (FUSE passthrough, no Cistern), and
	// the pool's next to it: what FUSE costs on this machine, a real peer's figure.
	loopback, loopbackPool []time.Duration
	// During the staged publish alone: how busy the CPUs were, and the S3 server's share of
	// them (it runs on the same cores here; a node's S3 is elsewhere).
	busyStaged, s3Staged []float64
}

// cpuTimes is the machine's CPU seconds (testutil.MachineCPU): all of it, and busy.
type cpuTimes struct{ total, busy float64 }

func readCPU(t *testing.T) cpuTimes {
	t.Helper()
	total, busy, _, err := testutil.MachineCPU()
	if err != nil {
		t.Fatal(err)
	}
	return cpuTimes{total, busy}
}

// busySince is the share of the CPUs' time that was busy since c.
func (c cpuTimes) busySince(t *testing.T) float64 { return c.busyTo(readCPU(t)) }

// busyTo is the share of the CPUs' time that was busy from c to now.
func (c cpuTimes) busyTo(now cpuTimes) float64 {
	if now.total == c.total {
		return 0
	}
	return (now.busy - c.busy) / (now.total - c.total)
}

// lines renders the line (medians of the per-sample ratios, their min-max in brackets)
// and the samples behind it (min/median/max seconds). Every ratio is ours ÷ the baseline's time
// (lower is better) but cached_read_ratio, a speed as the goal is: the pool's time ÷ the
// volume's (higher is better).
func (m streamMeasures) lines(set streamSet) []string {
	allBase := m.stagedAll
	if set.size < 1<<20 {
		allBase = m.staged // the goal for the small files: against the full staging alone
	}
	line := fmt.Sprintf("streaming: dataset=%s publish_s=%.3f first_byte_ratio=%s read_all_ratio=%s rclone_mount_ratio=%s cached_read_ratio=%s",
		set.name, med(m.publish).Seconds(), ratio(m.firstByte, m.get1), ratio(m.readAll, allBase), ratio(m.readAll, m.rclone), ratio(m.cachedPool, m.cachedVol))
	detail := fmt.Sprintf("  streaming_samples: dataset=%s publish_s=%s staged_publish_s=%s first_byte_s=%s get_1b_s=%s read_all_s=%s staged_read_all_s=%s rclone_read_all_s=%s cached_volume_s=%s cached_pool_s=%s streaming_volume_staged_s=%s read_all_cpu_busy=%s staged_read_all_cpu_busy=%s staged_publish_cpu_busy=%s staged_publish_s3_cpu=%s fuse_loopback_s=%s fuse_loopback_cached_ratio=%s",
		set.name, spreadOr(m.publish), spreadOr(m.staged), spreadOr(m.firstByte), spreadOr(m.get1), spreadOr(m.readAll), spreadOr(m.stagedAll),
		spreadOr(m.rclone), spreadOr(m.cachedVol), spreadOr(m.cachedPool), spreadOr(m.bgStaging), spreadF(m.busyReadAll), spreadF(m.busyStagedAll),
		spreadF(m.busyStaged), spreadF(m.s3Staged), spreadOr(m.loopback), ratio(m.loopbackPool, m.loopback))
	return []string{line, detail}
}

// ratio is the median of the per-sample ratios a[i]/b[i], with their min and max; n/a when either
// side was not measured.
func ratio(a, b []time.Duration) string {
	if len(a) == 0 || len(a) != len(b) {
		return "n/a"
	}
	r := make([]float64, len(a))
	for i := range a {
		r[i] = a[i].Seconds() / b[i].Seconds()
	}
	slices.Sort(r)
	return fmt.Sprintf("%.3f(%.3f-%.3f)", r[len(r)/2], r[0], r[len(r)-1])
}

// spreadF is min/median/max of fs, n/a when none.
func spreadF(fs []float64) string {
	if len(fs) == 0 {
		return "n/a"
	}
	s := slices.Clone(fs)
	slices.Sort(s)
	return fmt.Sprintf("%.2f/%.2f/%.2f", s[0], s[len(s)/2], s[len(s)-1])
}

func spreadOr(ds []time.Duration) string {
	if len(ds) == 0 {
		return "n/a"
	}
	return spreadS(ds)
}

// openFiles counts this process's open descriptors (the driver runs in it).
func openFiles(t *testing.T) int {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(fds)
}

func last(ds []time.Duration) time.Duration { return ds[len(ds)-1] }

// fillPage fills buf (a multiple of 4 KiB, starting at page first) with one 8-byte word per page,
// distinct per object and page: zram keeps such pages without memory.
func fillPage(buf []byte, obj, first int64) {
	for p := int64(0); p*4096 < int64(len(buf)); p++ {
		page := buf[p*4096 : min(int64(len(buf)), (p+1)*4096)]
		word := uint64(obj)<<40 | uint64(first+p)
		for k := 0; k+8 <= len(page); k += 8 {
			binary.LittleEndian.PutUint64(page[k:], word)
		}
	}
}

// upload puts the set's objects: large ones in 8 MiB parts, the others in one PUT each, 16 at a
// time.
func (b *streamBench) upload() {
	t, set := b.t, b.set
	if set.size > 256<<20 {
		b.putMultipart(set.key(0), set.size)
		return
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	next := make(chan int)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, set.size)
			for i := range next {
				fillPage(buf, int64(i), 0)
				if _, err := b.s3.Client.PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String("bench"),
					Key: aws.String(set.key(i)), Body: bytes.NewReader(buf)}); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := range set.count {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
}

// putMultipart uploads one large object in 8 MiB parts, 8 at a time.
func (b *streamBench) putMultipart(key string, size int64) {
	t, ctx := b.t, context.Background()
	const part = 8 << 20
	up, err := b.s3.Client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("bench"), Key: aws.String(key)})
	if err != nil {
		t.Fatal(err)
	}
	n := int((size + part - 1) / part)
	parts := make([]types.CompletedPart, n)
	next := make(chan int)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			buf := make([]byte, part)
			for i := range next {
				k := min(part, size-int64(i)*part)
				fillPage(buf[:k], 0, int64(i)*part/4096)
				out, err := b.s3.Client.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("bench"), Key: aws.String(key),
					UploadId: up.UploadId, PartNumber: aws.Int32(int32(i + 1)), Body: bytes.NewReader(buf[:k])})
				if err != nil {
					errs <- err
					continue
				}
				parts[i] = types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(int32(i + 1))}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(<-errs)
	}
	if _, err := b.s3.Client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("bench"), Key: aws.String(key),
		UploadId: up.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}}); err != nil {
		t.Fatal(err)
	}
}

// volumeContext names the set with an include pattern of the volume's own beside "**" (it matches
// no file): every volume is a dataset of its own.
func (b *streamBench) volumeContext(id, mode string) map[string]string {
	return map[string]string{"source": "s3://bench/" + b.set.name, "endpoint": b.s3.Endpoint, "pathStyle": "true",
		"include": "**, nomatch-" + id, "dataMode": mode}
}

func (b *streamBench) spec(id string) *datasource.Spec {
	vc := b.volumeContext(id, "")
	delete(vc, "dataMode")
	return datasource.SpecOf(mustParse(b.t, vc).Dataset)
}

func (b *streamBench) paths(id string) (staging, target string) {
	return filepath.Join(b.env.dir, "staging", id), filepath.Join(b.env.dir, "target", id)
}

// publish stages and publishes volume id (retrying while the driver answers Unavailable, as
// kubelet does) and returns the time it took and the target.
func (b *streamBench) publish(id, mode string) (time.Duration, string) {
	t := b.t
	vc := b.volumeContext(id, mode)
	staging, target := b.paths(id)
	start := time.Now()
	if err := retryUnavailable(t, func() error {
		_, err := b.env.node.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: id,
			StagingTargetPath: staging, VolumeCapability: roMany, VolumeContext: vc, Secrets: b.secrets})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.env.node.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: id,
		StagingTargetPath: staging, TargetPath: target, VolumeCapability: roMany, VolumeContext: vc, Readonly: true}); err != nil {
		t.Fatal(err)
	}
	d := time.Since(start)
	t.Cleanup(func() { b.unpublish(id) })
	return d, target
}

func (b *streamBench) unpublish(id string) {
	staging, target := b.paths(id)
	_, _ = b.env.node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	_, _ = b.env.node.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
}

// waitStaged waits for the background staging of volume id's dataset to end.
func (b *streamBench) waitStaged(id string) {
	spec := b.spec(id)
	for deadline := time.Now().Add(30 * time.Minute); ; {
		if st, _, _ := b.env.driver.cache.Status("fast", spec); st.Ready() {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatal("the streaming volume's staging did not end")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rangedGet1 times one GET of the first byte of the set's first object.
func (b *streamBench) rangedGet1() time.Duration {
	start := time.Now()
	out, err := b.s3.Client.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String("bench"),
		Key: aws.String(b.set.key(0)), Range: aws.String("bytes=0-0")})
	if err != nil {
		b.t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, out.Body); err != nil {
		b.t.Fatal(err)
	}
	out.Body.Close()
	return time.Since(start)
}

// rcloneRead starts `rclone mount --vfs-cache-mode full` of the set's prefix with an empty cache
// and times it to the last byte of walkRead; the mount and its cache go afterwards.
func (b *streamBench) rcloneRead(rclone string, i int) time.Duration {
	t := b.t
	dir := filepath.Join(b.root, fmt.Sprintf("rclone-%d", i))
	mnt, cache := filepath.Join(dir, "mnt"), filepath.Join(dir, "cache")
	for _, d := range []string{mnt, cache} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	cmd := exec.Command(rclone, "mount", "--vfs-cache-mode", "full", "--cache-dir", cache, "--read-only",
		"src:bench/"+b.set.name, mnt)
	cmd.Env = append(os.Environ(), "RCLONE_CONFIG=/dev/null", "RCLONE_CONFIG_SRC_TYPE=s3", "RCLONE_CONFIG_SRC_PROVIDER=Other",
		"RCLONE_CONFIG_SRC_ENDPOINT="+b.s3.Endpoint, "RCLONE_CONFIG_SRC_ACCESS_KEY_ID="+b.s3.AccessKey,
		"RCLONE_CONFIG_SRC_SECRET_ACCESS_KEY="+b.s3.SecretKey, "RCLONE_CONFIG_SRC_FORCE_PATH_STYLE=true", "RCLONE_CONFIG_SRC_REGION=us-east-1")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop := func() {
		_ = exec.Command("fusermount3", "-u", "-z", mnt).Run()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = os.RemoveAll(dir)
	}
	defer stop()
	// Mounted once the mount point's device differs from its parent's.
	for deadline := time.Now().Add(time.Minute); ; {
		var a, p unix.Stat_t
		if unix.Stat(mnt, &a) == nil && unix.Stat(dir, &p) == nil && a.Dev != p.Dev {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rclone mount did not come up: %s", out.String())
		}
		time.Sleep(time.Millisecond)
	}
	walkRead(t, mnt, -1)
	return time.Since(start)
}

// walkRead walks root (find) and reads each regular file in 4 MiB chunks, at most limit bytes of
// the first file when limit > 0 (then no other); it returns the time from the start to the first
// read of the first file returning, and to the last byte.
func walkRead(t *testing.T, root string, limit int) (first, all time.Duration) {
	t.Helper()
	start := time.Now()
	chunk := make([]byte, 4<<20)
	if limit > 0 {
		chunk = chunk[:min(len(chunk), limit)]
	}
	var files int
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		for {
			n, err := f.Read(chunk)
			if first == 0 && n > 0 {
				first = time.Since(start)
			}
			if err == io.EOF || (limit > 0 && n > 0) {
				break
			}
			if err != nil {
				return err
			}
		}
		files++
		if limit > 0 {
			return filepath.SkipAll
		}
		return nil
	})
	if err != nil || files == 0 {
		t.Fatalf("walk and read %s: %d files: %v", root, files, err)
	}
	return first, time.Since(start)
}

// coldWalkRead drops the pages of every file on the pool (the cached tree, and the volume's
// scratch copies, either of which a streaming volume's file may be passed through to) and of
// the files under root, then times walkRead of root.
func coldWalkRead(t *testing.T, root, pool string) time.Duration {
	t.Helper()
	dropPages(t, pool)
	dropPages(t, root)
	_, all := walkRead(t, root, -1)
	return all
}

// loopbackRead times coldWalkRead of dir through go-fuse's loopback filesystem, mounted afresh
// read-only with the streaming volume's mount options and cache timeouts: FUSE passthrough, each
// open a round trip to the server, as through a streaming volume.
func loopbackRead(t *testing.T, dir, pool string) time.Duration {
	t.Helper()
	root, err := gofs.NewLoopbackRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	long := time.Hour
	opts := &gofs.Options{EntryTimeout: &long, AttrTimeout: &long, MountOptions: fuse.MountOptions{
		FsName: "loopback", MaxReadAhead: 1 << 20, MaxWrite: 1 << 20, DisableXAttrs: true, Options: []string{"ro"}}}
	mnt := t.TempDir()
	server, err := gofs.Mount(mnt, root, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := server.Unmount(); err != nil {
			t.Error(err)
		}
	}()
	if server.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH == 0 {
		t.Fatal("the kernel offers no FUSE passthrough")
	}
	return coldWalkRead(t, mnt, pool)
}

// dropPageCache writes out and drops the machine's clean page cache.
func dropPageCache(t *testing.T) {
	t.Helper()
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
}

func dropPages(t *testing.T, root string) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func mustParse(t *testing.T, m map[string]string) cparams.Volume {
	t.Helper()
	v, err := volume.ParseParams(m, cparams.StaticPV)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func med(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func spreadS(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("%.3f/%.3f/%.3f", s[0].Seconds(), med(s).Seconds(), s[len(s)-1].Seconds())
}
