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
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cistern-csi/cistern/pkg/testpoint"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
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
	t     *testing.T
	n     *node
	s3    *testpeers.S3
	proxy *testpeers.Proxy
	// endpoint is the S3 endpoint volumes name: the proxy's (TestChaosChecks bypasses it).
	endpoint string
	rng      *rand.Rand
	secrets  map[string]string
	// The fault applied to object GETs: the first `left` of them get it.
	mu    sync.Mutex
	fault testpeers.Fault
	left  int
	// load, when set, faults the first GET of every object instead (load_test.go).
	load *loadFaults
}

func newSuite(t *testing.T, seed uint64) *suite {
	s := &suite{t: t, rng: rand.New(rand.NewPCG(seed, 29))}
	s.s3 = testpeers.StartS3(t, "")
	s.s3.Bucket(t, "chaos")
	s.proxy = testpeers.StartProxy(t, s.s3.Endpoint, s.chooser)
	s.endpoint = s.proxy.URL
	s.secrets = map[string]string{"accessKeyID": s.s3.AccessKey, "secretAccessKey": s.s3.SecretKey}
	s.n = startNode(t, 1<<30)
	return s
}

// chooser applies the round's fault to the first object GETs.
func (s *suite) chooser(r *http.Request, _ int64) testpeers.Fault {
	if r.Method != http.MethodGet || r.URL.Query().Has("list-type") {
		return testpeers.None
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.load != nil {
		return s.load.choose(r.URL.Path)
	}
	if s.left == 0 {
		return testpeers.None
	}
	if s.left > 0 {
		s.left--
	}
	return s.fault
}

// setFault applies f, counted by the proxy under name, to the next n object GETs (-1: all).
func (s *suite) setFault(name string, f testpeers.Fault, n int) {
	f.Name = name
	s.mu.Lock()
	s.fault, s.left = f, n
	s.mu.Unlock()
}

// minFile is the smallest file of a dataset: larger than any cut (ResetAfter), so that every
// cut fault the proxy is asked for leaves body to cut, and is delivered.
const minFile = 8 << 10

// dataset uploads a new dataset of a few files of random sizes and returns its files.
func (s *suite) dataset(prefix string, files int, maxSize int) map[string][]byte {
	want := map[string][]byte{}
	for i := range files {
		b := make([]byte, minFile+s.rng.IntN(maxSize))
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
		"endpoint": s.endpoint, "pathStyle": "true", "size": "64Mi"}
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

// result is how a round ended and what of its fault reached the driver.
type result struct {
	outcome, detail string
	// delivered is how many object GETs the proxy applied the round's fault to.
	delivered int
	// kills are the SIGKILLs that landed inside the call, at a point the driver reported
	// reaching and was held at; missed, the kills armed at points the call never reached.
	kills, missed int
}

type tally struct {
	rounds, delivered, kills, recovered, failedClean, undelivered, corrupted, leaked int
}

// s3Fault says whether the proxy delivers fault; kill faults are delivered as kills.
func s3Fault(fault string) bool {
	return fault != faultPoolFull && !killFault(fault)
}

func killFault(fault string) bool {
	return fault == faultKillStage || fault == faultKillPublish || fault == faultKillUnpub
}

// add counts round r under fault and returns what is wrong with it. A fault counts only when it
// reached the driver: a round whose S3 fault the proxy never applied (the proxy bypassed, the
// dataset a cache hit) or whose kill landed at no point of the call proves nothing, and fails.
func (tl *tally) add(fault string, r result) []string {
	tl.rounds++
	tl.delivered += r.delivered
	tl.kills += r.kills
	var problems []string
	undelivered := s3Fault(fault) && r.delivered == 0 || killFault(fault) && r.kills == 0
	// A persistent fault (access denied, a full pool) must fail cleanly, every other one be
	// recovered from: a run in which everything failed cleanly (say, the S3 endpoint refused)
	// compares nothing.
	persistent := fault == faultDenied || fault == faultPoolFull
	switch {
	case r.outcome == "corrupted":
		tl.corrupted++
		problems = append(problems, "CORRUPTED: "+r.detail)
	case r.outcome != "recovered" && r.outcome != "failed_clean":
		problems = append(problems, r.outcome+": "+r.detail)
	case undelivered:
		tl.undelivered++
		problems = append(problems, fmt.Sprintf("the fault was not delivered (%d applied, %d kills mid-call, %d missed): the round proves nothing", r.delivered, r.kills, r.missed))
	case r.outcome == "recovered":
		tl.recovered++
		if persistent {
			problems = append(problems, "recovered from a fault that must fail cleanly")
		}
	default:
		tl.failedClean++
		if !persistent {
			problems = append(problems, "failed (cleanly) where it must recover: "+r.detail)
		}
	}
	return problems
}

func (tl tally) String() string {
	return fmt.Sprintf("chaos: rounds=%d faults_delivered=%d kills_mid_call=%d recovered=%d failed_clean=%d undelivered=%d corrupted=%d leaked=%d",
		tl.rounds, tl.delivered, tl.kills, tl.recovered, tl.failedClean, tl.undelivered, tl.corrupted, tl.leaked)
}

func TestChaos(t *testing.T) {
	seed := uint64(envInt(t, "CISTERN_CHAOS_SEED", 1))
	rounds := envInt(t, "CISTERN_CHAOS_ROUNDS", len(faults))
	loadN := envInt(t, "CISTERN_CHAOS_LOAD", 200)
	loadDatasets := envInt(t, "CISTERN_CHAOS_LOAD_DATASETS", 20)
	// What the run must have shown to mean anything (make chaos and chaos-short set them).
	minFaults := envInt(t, "CISTERN_CHAOS_MIN_FAULTS", 1)
	minKills := envInt(t, "CISTERN_CHAOS_MIN_KILLS", 1)
	s := newSuite(t, seed)
	t.Logf("seed %d, %d rounds (CISTERN_CHAOS_SEED, CISTERN_CHAOS_ROUNDS); driver built with -race: %v", seed, rounds, testutil.RaceBinaries())

	var tl tally
	for i := range rounds {
		// Every fault once in a run of len(faults) rounds, in an order the seed decides.
		if i%len(faults) == 0 {
			s.rng.Shuffle(len(faults), func(a, b int) { faults[a], faults[b] = faults[b], faults[a] })
		}
		fault := faults[i%len(faults)]
		r := s.round(i, fault)
		for _, p := range tl.add(fault, r) {
			t.Errorf("round %d (%s): %s", i, fault, p)
		}
		if l := s.settledLeaks(); len(l) > 0 {
			tl.leaked++
			t.Errorf("round %d (%s): leaked %v", i, fault, l)
		}
		t.Logf("round %d: %s: %s (faults delivered %d, kills mid-call %d, missed %d) %s", i, fault, r.outcome, r.delivered, r.kills, r.missed, r.detail)
	}
	chaos := tl.String()
	load, problems := s.runLoad(loadN, loadDatasets)
	for _, p := range problems {
		t.Error(p)
	}
	t.Log(chaos)
	t.Log(load)
	fmt.Println(chaos)
	fmt.Println(load)
	if tl.delivered < minFaults {
		t.Errorf("%d faults delivered, want at least %d (CISTERN_CHAOS_MIN_FAULTS)", tl.delivered, minFaults)
	}
	if tl.kills < minKills {
		t.Errorf("%d kills mid-call, want at least %d (CISTERN_CHAOS_MIN_KILLS)", tl.kills, minKills)
	}
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
func (s *suite) round(i int, fault string) result {
	prefix := fmt.Sprintf("round-%d", i)
	want := s.dataset(prefix, 3+s.rng.IntN(4), 3<<20)
	if fault == faultPoolFull {
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
	return s.roundOn(i, fault, prefix, want)
}

// roundOn runs round i under fault on the dataset at prefix, which holds want.
func (s *suite) roundOn(i int, fault, prefix string, want map[string][]byte) result {
	switch fault {
	case faultSlowDown:
		s.setFault(fault, testpeers.Fault{Status: http.StatusServiceUnavailable, Code: "SlowDown", ResetAfter: -1}, 4)
	case fault500:
		s.setFault(fault, testpeers.Fault{Status: http.StatusInternalServerError, Code: "InternalError", ResetAfter: -1}, 4)
	case faultReset:
		s.setFault(fault, testpeers.Fault{ResetAfter: int64(1 + s.rng.IntN(4096))}, 3)
	case faultTruncated:
		s.setFault(fault, testpeers.Fault{ResetAfter: int64(1 + s.rng.IntN(4096)), Truncate: true}, 3)
	case faultStall:
		s.setFault(fault, testpeers.Fault{ResetAfter: 1024, Stall: 2 * time.Minute}, 2)
	case faultWrongBytes:
		s.setFault(fault, testpeers.Fault{ResetAfter: -1, Flip: true}, 3)
	case faultDenied:
		s.setFault(fault, testpeers.Fault{Status: http.StatusForbidden, Code: "AccessDenied", ResetAfter: -1}, -1)
	default:
		s.setFault("", testpeers.None, 0)
	}
	defer s.setFault("", testpeers.None, 0)
	before := s.proxy.Delivered(fault)
	var r result
	if fault == faultKillStage {
		r = s.stagedRound(i, prefix, want)
	} else {
		r = s.inlineRound(i, fault, prefix, want)
	}
	if s3Fault(fault) {
		r.delivered = s.proxy.Delivered(fault) - before
	}
	return r
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

// The points of each call a kill may land at (pkg/testpoint), in the order the call passes them.
var (
	publishPoints = []string{testpoint.StagingFileCommitted, testpoint.StagingSynced,
		testpoint.TreeReferenced, testpoint.TreeServed, testpoint.TreeMounted}
	unpublishPoints = []string{testpoint.TreeUnmounted, testpoint.TreeUnserved}
	stagePoints     = []string{testpoint.StagingFileCommitted, testpoint.StagingSynced,
		testpoint.ImageAttached, testpoint.ImageMounted, testpoint.ImageFilled}
)

// inlineRound publishes a read-only inline dataset volume (the dataset is staged at publish),
// checks it, and unpublishes it; kill faults SIGKILL the driver during publish or unpublish.
func (s *suite) inlineRound(i int, fault, prefix string, want map[string][]byte) result {
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
	var r result
	if fault == faultKillPublish {
		r.kills, r.missed = s.killsDuring(publish, publishPoints)
	}
	err := retry(3*time.Minute, publish)
	r.outcome = "recovered"
	switch {
	case err != nil && cleanError(err):
		r.outcome, r.detail = "failed_clean", err.Error()
	case err != nil:
		r.outcome, r.detail = "failed_unclear", err.Error()
	default:
		if d := compare(target, want); d != "" {
			r.outcome, r.detail = "corrupted", d
		}
	}
	if fault == faultKillUnpub && err == nil {
		r.kills, r.missed = s.killsDuring(unpublish, unpublishPoints)
	}
	if err := retry(time.Minute, unpublish); err != nil {
		r.outcome, r.detail = "failed_unclear", "unpublish: "+err.Error()
		return r
	}
	if _, err := os.Stat(target); !errors.Is(err, fs.ErrNotExist) {
		r.outcome, r.detail = "leaked", "target left behind"
	}
	return r
}

// stagedRound is a dynamic dataset volume (an ext4 image filled from the dataset) whose
// NodeStageVolume is cut by SIGKILLs, then staged, published, checked and deleted.
func (s *suite) stagedRound(i int, prefix string, want map[string][]byte) result {
	resp, err := retryCreate(s, fmt.Sprintf("chaos-staged-%d", i), map[string]string{"source": "s3://chaos/" + prefix,
		"endpoint": s.endpoint, "pathStyle": "true", "pool": "fast"})
	if err != nil {
		if cleanError(err) {
			return result{outcome: "failed_clean", detail: err.Error()}
		}
		return result{outcome: "failed_unclear", detail: "CreateVolume: " + err.Error()}
	}
	vol := resp.GetVolume()
	staging := filepath.Join(s.n.dir, "staging", vol.VolumeId)
	target := filepath.Join(s.n.dir, "pods", vol.VolumeId, "volume")
	stage := func(ctx context.Context) error {
		_, err := s.n.nodeC().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging,
			VolumeCapability: mountCap(), VolumeContext: vol.VolumeContext, Secrets: s.secrets})
		return err
	}
	r := result{outcome: "recovered"}
	r.kills, r.missed = s.killsDuring(stage, stagePoints)
	fail := func(what string, err error) result {
		r.outcome, r.detail = "failed_unclear", what+": "+err.Error()
		return r
	}
	if err := retry(3*time.Minute, stage); err != nil {
		r.outcome, r.detail = "failed_unclear", "stage: "+err.Error()
		if cleanError(err) {
			r.outcome = "failed_clean"
		}
	} else {
		if err := retry(time.Minute, func(ctx context.Context) error {
			_, err := s.n.nodeC().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging,
				TargetPath: target, VolumeCapability: mountCap(), VolumeContext: vol.VolumeContext})
			return err
		}); err != nil {
			return fail("publish", err)
		}
		if d := compare(target, want); d != "" {
			r.outcome, r.detail = "corrupted", d
		}
		if err := retry(time.Minute, func(ctx context.Context) error {
			_, err := s.n.nodeC().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: target})
			return err
		}); err != nil {
			return fail("unpublish", err)
		}
	}
	if err := retry(time.Minute, func(ctx context.Context) error {
		_, err := s.n.nodeC().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging})
		return err
	}); err != nil {
		return fail("unstage", err)
	}
	if err := retry(time.Minute, func(ctx context.Context) error {
		_, err := s.n.ctrlC().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.VolumeId})
		return err
	}); err != nil {
		return fail("delete", err)
	}
	return r
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

// killsPerRound is how many times a kill round SIGKILLs the driver inside its call: each time
// the call is made again, as kubelet retries it, and held at one of its points.
const killsPerRound = 3

// killsDuring makes call up to killsPerRound times, each time SIGKILLing the driver at the first
// point it reaches of a tail of points (where the tail starts, the seed decides). It stops when
// a call ends without reaching one (done, or failed before it): that kill is missed, not counted.
func (s *suite) killsDuring(call func(ctx context.Context) error, points []string) (kills, missed int) {
	for range killsPerRound {
		at := s.killAt(call, points[s.rng.IntN(len(points)):]...)
		if at == "" {
			return kills, missed + 1
		}
		kills++
		s.t.Logf("killed at %s", at)
	}
	return kills, missed
}

// killAt starts call with the driver to hold it at the first of points it reaches, SIGKILLs the
// driver there and starts it again. It returns the point and its subject, or "" when the call
// ended without reaching any (nothing killed).
func (s *suite) killAt(call func(ctx context.Context) error, points ...string) string {
	s.n.points.arm(points...)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = call(ctx)
	}()
	select {
	case at := <-s.n.points.held:
		s.n.kill()
		s.n.points.release()
		<-done
		s.n.restarts++
		s.n.start()
		return at
	case <-done:
		s.n.points.disarm()
		return ""
	}
}

func mountCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
}
