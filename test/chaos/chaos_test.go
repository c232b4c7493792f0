// Package chaos stages datasets through the real driver process while the object store
// misbehaves, the pool fills up and the driver is SIGKILLed at random points of staging,
// publishing and unpublishing (rounds chosen by a seeded random source, so a run is
// reproducible), then loads one node with many dataset volumes published at once. After every
// round each volume holds exactly the source's bytes or failed with a clear error, and nothing
// leaks: no mount, loop device or cache reference. `make chaos` runs it in full; `make test`
// runs a bounded part (docs/testing.md).
package chaos

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cistern-csi/cistern/test/testpeers"
)

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q", name, v)
	}
	return n
}

// The faults a round injects.
const (
	faultSlowDown    = "s3-503-slowdown"
	fault500         = "s3-500"
	faultReset       = "s3-reset-mid-body"
	faultTruncated   = "s3-truncated-body"
	faultStall       = "s3-stalled-read"
	faultWrongBytes  = "s3-wrong-bytes"
	faultDenied      = "s3-access-denied" // persistent: must fail cleanly
	faultPoolFull    = "pool-full"        // must fail cleanly
	faultKillStage   = "kill-during-stage"
	faultKillPublish = "kill-during-publish"
	faultKillUnpub   = "kill-during-unpublish"
)

var faults = []string{faultSlowDown, fault500, faultReset, faultTruncated, faultStall, faultWrongBytes,
	faultDenied, faultPoolFull, faultKillStage, faultKillPublish, faultKillUnpub}

type suite struct {
	t       *testing.T
	n       *node
	s3      *testpeers.S3
	proxy   *testpeers.Proxy
	rng     *rand.Rand
	secrets map[string]string
	// The fault applied to object GETs: the first `left` of them get it.
	mu    sync.Mutex
	fault testpeers.Fault
	left  int
}

// chooser applies the round's fault to the first object GETs.
func (s *suite) chooser(r *http.Request, _ int64) testpeers.Fault {
	if r.Method != http.MethodGet || r.URL.Query().Has("list-type") {
		return testpeers.None
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.left == 0 {
		return testpeers.None
	}
	if s.left > 0 {
		s.left--
	}
	return s.fault
}

func (s *suite) setFault(f testpeers.Fault, n int) {
	s.mu.Lock()
	s.fault, s.left = f, n
	s.mu.Unlock()
}

// dataset uploads a new dataset of a few files of random sizes and returns its files.
func (s *suite) dataset(prefix string, files int, maxSize int) map[string][]byte {
	want := map[string][]byte{}
	for i := range files {
		b := make([]byte, 1+s.rng.IntN(maxSize))
		for j := range b {
			b[j] = byte(s.rng.Uint32())
		}
		name := fmt.Sprintf("d%d/f%d.bin", i%2, i)
		want[name] = b
		s.s3.Put(s.t, "chaos", prefix+"/"+name, b)
	}
	return want
}

func (s *suite) inlineContext(prefix string) map[string]string {
	return map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://chaos/" + prefix,
		"endpoint": s.proxy.URL, "pathStyle": "true", "size": "64Mi"}
}

// compare says how the tree at dir differs from want ("" when identical).
func compare(dir string, want map[string][]byte) string {
	seen := 0
	var diff []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if strings.HasPrefix(rel, "lost+found") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		w, ok := want[rel]
		switch {
		case !ok:
			diff = append(diff, "extra "+rel)
		case !bytes.Equal(b, w):
			diff = append(diff, fmt.Sprintf("%s: sha256 %x, want %x", rel, sha256.Sum256(b), sha256.Sum256(w)))
		default:
			seen++
		}
		return nil
	})
	if err != nil {
		diff = append(diff, err.Error())
	}
	if seen+len(diff) < len(want) {
		diff = append(diff, fmt.Sprintf("%d of %d files missing", len(want)-seen, len(want)))
	}
	return strings.Join(diff, "; ")
}

// retry repeats call while it answers Unavailable or Aborted (in progress, as kubelet retries),
// or the driver is unreachable (restarting), for up to limit.
func retry(limit time.Duration, call func(ctx context.Context) error) error {
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		err := call(ctx)
		cancel()
		switch status.Code(err) {
		case codes.Unavailable, codes.Aborted, codes.DeadlineExceeded:
			if time.Now().After(deadline) {
				return err
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		return err
	}
}

// cleanError is a failure told clearly: a final gRPC code (not Unknown, Internal or a retry) and
// a message naming the dataset, or the pool that is full.
func cleanError(err error) bool {
	st, _ := status.FromError(err)
	switch st.Code() {
	case codes.PermissionDenied, codes.OutOfRange, codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition:
		return strings.Contains(st.Message(), "s3://")
	case codes.ResourceExhausted:
		return strings.Contains(st.Message(), "s3://") || strings.Contains(st.Message(), "pool is full")
	}
	return false
}

type tally struct{ rounds, faults, recovered, failedClean, corrupted, leaked int }

func TestChaos(t *testing.T) {
	seed := uint64(envInt(t, "CISTERN_CHAOS_SEED", 1))
	rounds := envInt(t, "CISTERN_CHAOS_ROUNDS", len(faults))
	loadN := envInt(t, "CISTERN_CHAOS_LOAD", 200)
	s := &suite{t: t, rng: rand.New(rand.NewPCG(seed, 29))}
	s.s3 = testpeers.StartS3(t, "")
	s.s3.Bucket(t, "chaos")
	s.proxy = testpeers.StartProxy(t, s.s3.Endpoint, s.chooser)
	s.secrets = map[string]string{"accessKeyID": s.s3.AccessKey, "secretAccessKey": s.s3.SecretKey}
	s.n = startNode(t, 1<<30)
	t.Logf("seed %d, %d rounds (CISTERN_CHAOS_SEED, CISTERN_CHAOS_ROUNDS)", seed, rounds)

	var tl tally
	for i := range rounds {
		// Every fault once in a run of len(faults) rounds, in an order the seed decides.
		if i%len(faults) == 0 {
			s.rng.Shuffle(len(faults), func(a, b int) { faults[a], faults[b] = faults[b], faults[a] })
		}
		fault := faults[i%len(faults)]
		outcome, detail := s.round(i, fault)
		tl.rounds++
		tl.faults++
		// A persistent fault (access denied, a full pool) must fail cleanly, every other one be
		// recovered from: a run in which everything failed cleanly (say, the S3 endpoint refused)
		// compares nothing.
		persistent := fault == faultDenied || fault == faultPoolFull
		switch outcome {
		case "recovered":
			tl.recovered++
			if persistent {
				t.Errorf("round %d (%s): recovered from a fault that must fail cleanly", i, fault)
			}
		case "failed_clean":
			tl.failedClean++
			if !persistent {
				t.Errorf("round %d (%s): failed (cleanly) where it must recover: %s", i, fault, detail)
			}
		case "corrupted":
			tl.corrupted++
			t.Errorf("round %d (%s): CORRUPTED: %s", i, fault, detail)
		default:
			t.Errorf("round %d (%s): %s: %s", i, fault, outcome, detail)
		}
		if l := s.settledLeaks(); len(l) > 0 {
			tl.leaked++
			t.Errorf("round %d (%s): leaked %v", i, fault, l)
		}
		t.Logf("round %d: %s: %s %s", i, fault, outcome, detail)
	}
	chaos := fmt.Sprintf("chaos: rounds=%d faults=%d recovered=%d failed_clean=%d corrupted=%d leaked=%d",
		tl.rounds, tl.faults, tl.recovered, tl.failedClean, tl.corrupted, tl.leaked)
	load := s.load(loadN)
	t.Log(chaos)
	t.Log(load)
	fmt.Println(chaos)
	fmt.Println(load)
}

// settledLeaks waits briefly for background cleanup (trash removal), then lists leaks.
func (s *suite) settledLeaks() []string {
	var l []string
	for range 50 {
		if l = s.n.leaks(); len(l) == 0 {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return l
}

// round runs one volume's life under fault and says how it ended.
func (s *suite) round(i int, fault string) (outcome, detail string) {
	prefix := fmt.Sprintf("round-%d", i)
	want := s.dataset(prefix, 3+s.rng.IntN(4), 3<<20)
	s.setFault(testpeers.None, 0)
	switch fault {
	case faultSlowDown:
		s.setFault(testpeers.Fault{Status: http.StatusServiceUnavailable, Code: "SlowDown", ResetAfter: -1}, 4)
	case fault500:
		s.setFault(testpeers.Fault{Status: http.StatusInternalServerError, Code: "InternalError", ResetAfter: -1}, 4)
	case faultReset:
		s.setFault(testpeers.Fault{ResetAfter: int64(1 + s.rng.IntN(4096))}, 3)
	case faultTruncated:
		s.setFault(testpeers.Fault{ResetAfter: int64(1 + s.rng.IntN(4096)), Truncate: true}, 3)
	case faultStall:
		s.setFault(testpeers.Fault{ResetAfter: 1024, Stall: 2 * time.Minute}, 2)
	case faultWrongBytes:
		s.setFault(testpeers.Fault{ResetAfter: -1, Flip: true}, 3)
	case faultDenied:
		s.setFault(testpeers.Fault{Status: http.StatusForbidden, Code: "AccessDenied", ResetAfter: -1}, -1)
	case faultPoolFull:
		// Leave less room than the dataset needs.
		filler := filepath.Join(s.n.pool, "filler")
		fillPool(s.t, s.n.pool, filler, 2<<20)
		defer s.waitPoolRoom()
		defer os.Remove(filler)
		// The dataset is larger than what is left.
		for k := range 4 {
			name := fmt.Sprintf("big/%d.bin", k)
			b := make([]byte, 2<<20)
			for j := range b {
				b[j] = byte(s.rng.Uint32())
			}
			want[name] = b
			s.s3.Put(s.t, "chaos", prefix+"/"+name, b)
		}
	}
	defer s.setFault(testpeers.None, 0)
	if fault == faultKillStage {
		return s.stagedRound(i, prefix, want)
	}
	return s.inlineRound(i, fault, prefix, want)
}

func fillPool(t *testing.T, pool, path string, leave int64) {
	var st syscallStatfs
	if err := statfs(pool, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for left := free - leave; left > 0; left -= int64(len(buf)) {
		if int64(len(buf)) > left {
			buf = buf[:left]
		}
		if _, err := f.Write(buf); err != nil {
			break // full
		}
	}
	_ = f.Sync()
}

// inlineRound publishes a read-only inline dataset volume (the dataset is staged at publish),
// checks it, and unpublishes it; kill faults SIGKILL the driver during publish or unpublish.
func (s *suite) inlineRound(i int, fault, prefix string, want map[string][]byte) (string, string) {
	id := fmt.Sprintf("chaos-inline-%d", i)
	target := filepath.Join(s.n.dir, "pods", id, "volume")
	vc := s.inlineContext(prefix)
	publish := func(ctx context.Context) error {
		_, err := s.n.nodeC().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
			VolumeCapability: mountCap(), VolumeContext: vc, Readonly: true, Secrets: s.secrets})
		return err
	}
	unpublish := func(ctx context.Context) error {
		_, err := s.n.nodeC().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		return err
	}
	if fault == faultKillPublish {
		s.killDuring(publish)
	}
	err := retry(3*time.Minute, publish)
	outcome, detail := "recovered", ""
	switch {
	case err != nil && cleanError(err):
		outcome, detail = "failed_clean", err.Error()
	case err != nil:
		outcome, detail = "failed_unclear", err.Error()
	default:
		if d := compare(target, want); d != "" {
			outcome, detail = "corrupted", d
		}
	}
	if fault == faultKillUnpub && err == nil {
		s.killDuring(unpublish)
	}
	if err := retry(time.Minute, unpublish); err != nil {
		return "failed_unclear", "unpublish: " + err.Error()
	}
	if _, err := os.Stat(target); !errors.Is(err, fs.ErrNotExist) {
		return "leaked", "target left behind"
	}
	return outcome, detail
}

// stagedRound is a dynamic dataset volume (an ext4 image filled from the dataset) whose
// NodeStageVolume is cut by a SIGKILL, then staged, published, checked and deleted.
func (s *suite) stagedRound(i int, prefix string, want map[string][]byte) (string, string) {
	resp, err := retryCreate(s, fmt.Sprintf("chaos-staged-%d", i), map[string]string{"source": "s3://chaos/" + prefix,
		"endpoint": s.proxy.URL, "pathStyle": "true", "pool": "fast"})
	if err != nil {
		if cleanError(err) {
			return "failed_clean", err.Error()
		}
		return "failed_unclear", "CreateVolume: " + err.Error()
	}
	vol := resp.GetVolume()
	staging := filepath.Join(s.n.dir, "staging", vol.VolumeId)
	target := filepath.Join(s.n.dir, "pods", vol.VolumeId, "volume")
	stage := func(ctx context.Context) error {
		_, err := s.n.nodeC().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging,
			VolumeCapability: mountCap(), VolumeContext: vol.VolumeContext, Secrets: s.secrets})
		return err
	}
	s.killDuring(stage)
	outcome, detail := "recovered", ""
	if err := retry(3*time.Minute, stage); err != nil {
		outcome, detail = "failed_unclear", "stage: "+err.Error()
		if cleanError(err) {
			outcome = "failed_clean"
		}
	} else {
		if err := retry(time.Minute, func(ctx context.Context) error {
			_, err := s.n.nodeC().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging,
				TargetPath: target, VolumeCapability: mountCap(), VolumeContext: vol.VolumeContext})
			return err
		}); err != nil {
			return "failed_unclear", "publish: " + err.Error()
		}
		if d := compare(target, want); d != "" {
			outcome, detail = "corrupted", d
		}
		if err := retry(time.Minute, func(ctx context.Context) error {
			_, err := s.n.nodeC().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: target})
			return err
		}); err != nil {
			return "failed_unclear", "unpublish: " + err.Error()
		}
	}
	if err := retry(time.Minute, func(ctx context.Context) error {
		_, err := s.n.nodeC().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging})
		return err
	}); err != nil {
		return "failed_unclear", "unstage: " + err.Error()
	}
	if err := retry(time.Minute, func(ctx context.Context) error {
		_, err := s.n.ctrlC().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.VolumeId})
		return err
	}); err != nil {
		return "failed_unclear", "delete: " + err.Error()
	}
	return outcome, detail
}

// waitPoolRoom waits, once the filler is gone, until the driver offers a volume's room on the
// pool again (its pool check), as the provisioner's retries would: the next round starts on a
// pool the driver sees free.
func (s *suite) waitPoolRoom() {
	err := retry(time.Minute, func(ctx context.Context) error {
		resp, err := s.n.ctrlC().GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: map[string]string{"pool": "fast"}})
		if err == nil && resp.GetAvailableCapacity() < 64<<20 {
			err = status.Errorf(codes.Unavailable, "the pool offers %d bytes", resp.GetAvailableCapacity())
		}
		return err
	})
	if err != nil {
		s.t.Errorf("the pool emptied of its filler is not offered again: %v", err)
	}
}

func retryCreate(s *suite, name string, params map[string]string) (*csi.CreateVolumeResponse, error) {
	var resp *csi.CreateVolumeResponse
	err := retry(3*time.Minute, func(ctx context.Context) error {
		var err error
		resp, err = s.n.ctrlC().CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name,
			CapacityRange:      &csi.CapacityRange{RequiredBytes: 64 << 20},
			VolumeCapabilities: []*csi.VolumeCapability{mountCap()}, Parameters: params, Secrets: s.secrets})
		return err
	})
	return resp, err
}

// killDuring starts call and SIGKILLs the driver at a random moment of it (seeded), then starts
// the driver again.
func (s *suite) killDuring(call func(ctx context.Context) error) {
	delay := time.Duration(s.rng.IntN(1500)) * time.Millisecond
	done := make(chan struct{})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = call(ctx)
		close(done)
	}()
	select {
	case <-time.After(delay):
	case <-done:
	}
	s.n.restart()
	<-done
}

func mountCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
}

// load publishes n read-only inline volumes of one dataset at once on the node, as n pods
// starting together would, and times each from its first call to its success.
func (s *suite) load(n int) string {
	if n == 0 {
		return "load: volumes=0"
	}
	want := s.dataset("load", 8, 1<<20)
	vc := s.inlineContext("load")
	durations := make([]float64, n)
	var errs atomic.Int64
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() {
			id := fmt.Sprintf("chaos-load-%d", k)
			target := filepath.Join(s.n.dir, "pods", id, "volume")
			start := time.Now()
			err := retry(5*time.Minute, func(ctx context.Context) error {
				_, err := s.n.nodeC().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
					VolumeCapability: mountCap(), VolumeContext: vc, Readonly: true, Secrets: s.secrets})
				return err
			})
			durations[k] = time.Since(start).Seconds()
			if err != nil {
				errs.Add(1)
				s.t.Errorf("load volume %d: %v", k, err)
				return
			}
			if d := compare(target, want); d != "" {
				errs.Add(1)
				s.t.Errorf("load volume %d: %s", k, d)
			}
		})
	}
	wg.Wait()
	for k := range n {
		id := fmt.Sprintf("chaos-load-%d", k)
		target := filepath.Join(s.n.dir, "pods", id, "volume")
		if err := retry(time.Minute, func(ctx context.Context) error {
			_, err := s.n.nodeC().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
			return err
		}); err != nil {
			errs.Add(1)
			s.t.Errorf("unpublish load volume %d: %v", k, err)
		}
	}
	if l := s.settledLeaks(); len(l) > 0 {
		s.t.Errorf("load: leaked %v", l)
	}
	sort.Float64s(durations)
	q := func(p float64) float64 { return durations[int(p*float64(n-1)+0.5)] }
	return fmt.Sprintf("load: volumes=%d p50_s=%.2f p99_s=%.2f errors=%d", n, q(0.5), q(0.99), errs.Load())
}
