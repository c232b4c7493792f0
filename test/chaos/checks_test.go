package chaos

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/cistern-csi/cistern/pkg/testpoint"
	"github.com/cistern-csi/cistern/test/framework/kit"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// TestChaosChecks tests the checks TestChaos counts and fails by: each is shown to tell a fault
// from no fault, so that none can pass a run it cannot see.
func TestChaosChecks(t *testing.T) {
	s := newSuite(t, 7)

	// The proxy counts a fault only when it changed the response: not a cut after the whole body,
	// not a flip of an error answer, not a fault of a request that never came.
	t.Run("proxy counts applied faults only", func(t *testing.T) {
		s.s3.Put(t, "chaos", "check/small", []byte("short"))
		s.s3.Put(t, "chaos", "check/large", make([]byte, minFile))
		var next atomic.Pointer[testpeers.Fault]
		p := testpeers.StartProxy(t, s.s3.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
			if f := next.Swap(nil); f != nil {
				return *f
			}
			return testpeers.None
		})
		c := s.s3.NewClient(p.URL)
		get := func(key string, f testpeers.Fault) {
			next.Store(&f)
			out, err := c.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String("chaos"), Key: aws.String(key)},
				func(o *s3.Options) { o.RetryMaxAttempts = 1 })
			if err == nil { // read to the end: a fault cut short by a client gone is not delivered
				_, _ = io.Copy(io.Discard, out.Body)
				out.Body.Close()
			}
		}
		for _, tc := range []struct {
			key  string
			f    testpeers.Fault
			want int
		}{
			{"check/small", testpeers.Fault{Name: "cut-after-body", ResetAfter: 4096}, 0},
			{"check/large", testpeers.Fault{Name: "cut-in-body", ResetAfter: 4096}, 1},
			{"check/small", testpeers.Fault{Name: "truncate-after-body", ResetAfter: 4096, Truncate: true}, 0},
			{"check/missing", testpeers.Fault{Name: "flip-of-error", ResetAfter: -1, Flip: true}, 0},
			{"check/large", testpeers.Fault{Name: "flip", ResetAfter: -1, Flip: true}, 1},
			{"check/small", testpeers.Fault{Name: "status", Status: http.StatusServiceUnavailable, Code: "SlowDown", ResetAfter: -1}, 1},
		} {
			get(tc.key, tc.f)
			if got := p.Delivered(tc.f.Name); got != tc.want {
				t.Errorf("%s on %s: delivered %d, want %d", tc.f.Name, tc.key, got, tc.want)
			}
		}
		if got := p.Delivered("never-asked"); got != 0 {
			t.Errorf("a fault of no request: delivered %d", got)
		}
	})

	// A round whose volume bypasses the proxy gets no fault to the driver: it is not counted as
	// recovered, nor its fault as delivered, and it fails. The same fault through the proxy is.
	// (A cache hit is no such case: the driver proves each caller's access with a GET, which
	// gets the fault.)
	t.Run("an undelivered fault is not counted", func(t *testing.T) {
		var tl tally
		s.endpoint = s.s3.Endpoint
		r := s.roundOn(101, faultSlowDown, "check-bypass", s.dataset("check-bypass", 3, 64<<10))
		s.endpoint = s.proxy.URL
		problems := tl.add(faultSlowDown, r)
		if r.outcome != "recovered" || r.delivered != 0 || tl.delivered != 0 || tl.recovered != 0 || tl.undelivered != 1 ||
			len(problems) != 1 || !strings.Contains(problems[0], "not delivered") {
			t.Errorf("a fault bypassed: %+v, tally %+v, problems %q", r, tl, problems)
		}
		r = s.roundOn(102, faultSlowDown, "check-new", s.dataset("check-new", 3, 64<<10))
		if problems := tl.add(faultSlowDown, r); len(problems) > 0 || r.delivered == 0 || tl.recovered != 1 {
			t.Errorf("a fault on a new dataset: %+v, tally %+v, problems %q", r, tl, problems)
		}
	})

	// Load volumes that bypass the proxy come up right, but with no fault delivered to their
	// datasets: the load fails.
	t.Run("a load without faults fails", func(t *testing.T) {
		s.endpoint = s.s3.Endpoint
		line, problems := s.runLoad(4, 2)
		s.endpoint = s.proxy.URL
		if len(problems) != 2 || !strings.Contains(problems[0], "no fault was delivered") || !strings.Contains(line, "faults_delivered=0") ||
			!strings.Contains(line, "errors=0") {
			t.Errorf("%s; problems %q", line, problems)
		}
	})

	// A kill armed at a point the call never reaches kills nothing and is not counted; one armed
	// at a point it reaches lands there, inside the call.
	t.Run("a kill counts only at a point reached", func(t *testing.T) {
		restarts := s.n.restarts
		unpublish := func(ctx context.Context) error {
			_, err := s.n.nodeC().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "chaos-never-published",
				TargetPath: filepath.Join(s.n.dir, "pods", "chaos-never-published", "volume")})
			return err
		}
		if at := s.killAt(unpublish, unpublishPoints...); at != "" || s.n.restarts != restarts {
			t.Errorf("unpublishing what was never published was killed at %q", at)
		}
		var tl tally
		if problems := tl.add(faultKillUnpub, result{outcome: "recovered", missed: 1}); tl.kills != 0 || tl.undelivered != 1 || len(problems) != 1 {
			t.Errorf("a round with no kill reached: tally %+v, problems %q", tl, problems)
		}
		want := s.dataset("check-kill", 3, 64<<10)
		id := "chaos-check-kill"
		target := filepath.Join(s.n.dir, "pods", id, "volume")
		vc := s.inlineContext("check-kill")
		publish := func(ctx context.Context) error {
			_, err := s.n.nodeC().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
				VolumeCapability: mountCap(), VolumeContext: vc, Readonly: true, Secrets: s.secrets})
			return err
		}
		reached := s.n.points.count(testpoint.TreeServed)
		at := s.killAt(publish, testpoint.TreeServed)
		if !strings.HasPrefix(at, testpoint.TreeServed+" "+id) || s.n.restarts != restarts+1 || s.n.points.count(testpoint.TreeServed) != reached+1 {
			t.Errorf("a kill at %s: killed at %q, %d restarts", testpoint.TreeServed, at, s.n.restarts-restarts)
		}
		if err := retry(time.Minute, publish); err != nil {
			t.Fatal(err)
		}
		if d := compare(target, want); d != "" {
			t.Errorf("after the kill: %s", d)
		}
		if err := retry(time.Minute, func(ctx context.Context) error {
			_, err := s.n.nodeC().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a changed file is corrupted", func(t *testing.T) {
		dir := t.TempDir()
		want := map[string][]byte{"a": []byte("abc")}
		if err := os.WriteFile(filepath.Join(dir, "a"), []byte("abc"), 0o644); err != nil {
			t.Fatal(err)
		}
		if d := compare(dir, want); d != "" {
			t.Errorf("identical: %s", d)
		}
		if err := os.WriteFile(filepath.Join(dir, "a"), []byte("abd"), 0o644); err != nil {
			t.Fatal(err)
		}
		if d := compare(dir, want); !strings.Contains(d, "sha256") {
			t.Errorf("a changed byte: %q", d)
		}
	})

	t.Run("a cache reference left is a leak", func(t *testing.T) {
		if l := s.settledLeaks(); len(l) > 0 {
			t.Fatalf("leaks before: %v", l)
		}
		refs := filepath.Join(s.n.pool, ".cistern-cache", "check-leak", "refs")
		if err := os.MkdirAll(refs, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(refs, "chaos-gone"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if l := s.n.leaks(); len(l) != 1 || !strings.Contains(l[0], "check-leak/refs/chaos-gone") {
			t.Errorf("a planted reference: leaks %v", l)
		}
		if err := os.RemoveAll(filepath.Dir(refs)); err != nil {
			t.Fatal(err)
		}
	})

	// A race report in a child's log is found (the node's cleanup fails the test on one).
	t.Run("a race report is found", func(t *testing.T) {
		bin := filepath.Join(t.TempDir(), "racy")
		build := exec.Command("go", "build", "-race", "-o", bin, "./test/chaos/testdata/racy")
		build.Dir = kit.RepoRoot()
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building with -race: %v\n%s", err, out)
		}
		out, err := exec.Command(bin).CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 66 {
			t.Errorf("the racy child: %v (want the race detector's exit status 66)", err)
		}
		if races := testutil.RaceReports(out); len(races) != 1 || !strings.Contains(races[0], "racy/main.go") {
			t.Errorf("%d reports in %q", len(races), out)
		}
		if races := testutil.RaceReports([]byte("I1203 driver log\n==================\n")); len(races) != 0 {
			t.Errorf("a log without a race: %q", races)
		}
		// The node's check reads its driver's log, of every process it started.
		n := &node{logPath: filepath.Join(t.TempDir(), "driver.log")}
		if err := os.WriteFile(n.logPath, append([]byte("I1203 started\n"), out...), 0o644); err != nil {
			t.Fatal(err)
		}
		if races := n.raceReports(); len(races) != 1 {
			t.Errorf("the node found %d reports in its log", len(races))
		}
	})
}
