package driver

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	mount "k8s.io/mount-utils"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/fusekeeper"
	cparams "github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/volume"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// The tests of republishes (pkg/volume/republish.go): kubelet calls NodePublishVolume again
// while the pod runs (the CSIDriver's requiresRepublish) with the pod's current ServiceAccount
// token, which the reads made with the pod's web identity take for their next exchanges at the
// STS. The STS stand-in's clock is moved past a token's expiry rather than waited for; its keys
// last a second where a test needs every S3 request to exchange its token first, as the SDK
// does once an hour's keys near their end.

const (
	republishRole     = "arn:aws:iam::000000000000:role/team-a"
	republishAudience = "sts.amazonaws.com"
)

// requireFUSE fails (under CI) or skips a test that streams without root and /dev/fuse.
func requireFUSE(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil || os.Geteuid() != 0 {
		testutil.Unavailable(t, "streaming volumes need root and /dev/fuse")
	}
}

// webIdentityPeers is versitygw with files in bucket "private" under set/, an OIDC issuer and
// an STS stand-in whose role team-a, trusting team-a/trainer, hands keys that last keyLifetime.
func webIdentityPeers(t *testing.T, files map[string][]byte, keyLifetime time.Duration) (*testpeers.S3, *testpeers.OIDCIssuer, *testpeers.STS) {
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "private")
	for k, v := range files {
		s.Put(t, "private", "set/"+k, v)
	}
	issuer := testpeers.StartOIDCIssuer(t)
	sts := testpeers.StartSTS(t, issuer.URL, republishAudience, map[string]testpeers.Role{republishRole: {
		Trusts: []string{"system:serviceaccount:team-a:trainer"}, AccessKey: s.AccessKey, SecretKey: s.SecretKey, KeyLifetime: keyLifetime}})
	return s, issuer, sts
}

// inlineStreaming is the volume context of a read-only inline volume streaming s3://private/set
// from endpoint with the pod's web identity (without the pod's tokens).
func inlineStreaming(endpoint string) map[string]string {
	return map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://private/set", "endpoint": endpoint,
		"pathStyle": "true", "credentials": "webIdentity", "roleARN": republishRole, "dataMode": "streaming"}
}

// TestWebIdentityRenewedToken: a read-only inline volume streams a dataset with its pod's web
// identity, through the CSI socket, real FUSE, versitygw and the STS stand-in, while its staging
// runs (a proxy answers SlowDown to its GETs of late.bin until the test lets them through). Its
// pod's token expires meanwhile, after kubelet's republish brought the next one: the republish
// changes nothing at the target, and the staging and the streaming reads exchange the new token
// from then on, so late.bin reads byte-identical and the staging completes. Before, they kept
// the token of the first publish, and the read got EIO (the staging failed) once it expired.
func TestWebIdentityRenewedToken(t *testing.T) {
	requireFUSE(t)
	files := map[string][]byte{"first.txt": []byte("read before the token expires"),
		"late.bin": bytes.Repeat([]byte("read after it expired "), 4096)}
	s, issuer, sts := webIdentityPeers(t, files, time.Second)
	var held atomic.Bool
	held.Store(true)
	proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if held.Load() && r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/set/late.bin") {
			return testpeers.Fault{Status: http.StatusServiceUnavailable, Code: "SlowDown", ResetAfter: -1}
		}
		return testpeers.None
	})
	env := startDriver(t, testPool{name: "fast"})
	env.stop()
	env.cfg.Datasets.STSEndpoint = sts.URL
	env.cfg.Datasets.Retries = 100 // late.bin's GETs are refused for as long as the test needs
	env.start()
	ctx := context.Background()
	target := filepath.Join(env.dir, "target", "trainer-pod")
	vc := inlineStreaming(proxy.URL)
	token := ""
	publish := func(exp time.Time) error {
		c := maps.Clone(vc)
		maps.Copy(c, saTokensUntil(t, issuer, "team-a/trainer", "trainer-pod", exp))
		token = tokenOf(t, c)
		_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "trainer-pod", TargetPath: target,
			VolumeCapability: mountCap(""), VolumeContext: c, Readonly: true})
		return err
	}
	read := func(name string) {
		t.Helper()
		if b, err := os.ReadFile(filepath.Join(target, name)); err != nil || !bytes.Equal(b, files[name]) {
			t.Fatalf("%s: %d bytes, %v; want the %d bytes in S3", name, len(b), err, len(files[name]))
		}
	}

	first := sts.Now().Add(time.Hour) // kubelet's token of an hour
	if err := retryUnavailable(t, func() error { return publish(first) }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "trainer-pod", TargetPath: target})
	})
	read("first.txt")
	// The staging tries late.bin, and is told to retry.
	for deadline := time.Now().Add(time.Minute); proxy.Gets("/private/set/late.bin") == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the staging did not ask for late.bin within a minute")
		}
	}
	mounts := mountIDs(t, target)

	// kubelet's republish at 80% of the token's life brings the next; then the first expires.
	if err := publish(first.Add(48 * time.Minute)); err != nil {
		t.Fatalf("republish: %v", err)
	}
	if got := mountIDs(t, target); got != mounts {
		t.Errorf("the republish changed the mounts at the target: %s, then %s", mounts, got)
	}
	// The first token expires once the staging's retries exchange the next: an exchange of the
	// first one already under way would meet its expiry. (A staging that never takes the next
	// token fails at the expiry: the read below says so.)
	for deadline := time.Now().Add(30 * time.Second); sts.ExchangesOf(token) == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Log("the staging's retries did not exchange the renewed token within 30 s")
			break
		}
	}
	sts.Advance(70 * time.Minute)
	held.Store(false)
	read("late.bin")

	parsed, err := volume.ParseParams(vc, cparams.Inline)
	if err != nil {
		t.Fatal(err)
	}
	spec := datasource.SpecOf(parsed.Dataset)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if st, _, _ := env.driver.cache.Status("fast", spec); st.Ready() {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the staging did not complete: %v", st)
		}
	}
}

// TestWebIdentityTakeoverRenewedToken: the FUSE keeper's copy of a streaming volume's access is
// renewed with its pod's token at each republish, so that a restart of the plugin after the
// first token expired takes the volume over (its caller proved again with the token kubelet
// passed last) and its reads go on. Before, the keeper kept the first token, and the volume
// taken over an hour after its publish read EIO.
func TestWebIdentityTakeoverRenewedToken(t *testing.T) {
	requireFUSE(t)
	files := map[string][]byte{"model.bin": []byte("weights of team a"), "config.json": []byte(`{"layers": 2}`)}
	s, issuer, sts := webIdentityPeers(t, files, 0)
	env := startDriver(t, testPool{name: "fast"})
	k, err := fusekeeper.Listen(filepath.Join(env.dir, "keeper.sock"))
	if err != nil {
		t.Fatal(err)
	}
	kctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Serve(kctx) }()
	t.Cleanup(func() { cancel(); <-done })
	env.stop()
	env.cfg.Datasets.STSEndpoint = sts.URL
	env.cfg.Streaming.Keeper = k.Path()
	var refused []string
	var mu sync.Mutex
	env.cfg.Streaming.OnRefused = func(id, _, reason string) { mu.Lock(); refused = append(refused, id+": "+reason); mu.Unlock() }
	env.start()
	ctx := context.Background()
	target := filepath.Join(env.dir, "target", "trainer-pod")
	publish := func(exp time.Time) error {
		c := inlineStreaming(s.Endpoint)
		maps.Copy(c, saTokensUntil(t, issuer, "team-a/trainer", "trainer-pod", exp))
		_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "trainer-pod", TargetPath: target,
			VolumeCapability: mountCap(""), VolumeContext: c, Readonly: true})
		return err
	}
	first := sts.Now().Add(time.Hour)
	if err := retryUnavailable(t, func() error { return publish(first) }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "trainer-pod", TargetPath: target})
	})
	checkFiles(t, target, map[string]string{"model.bin": "weights of team a"})
	if err := publish(first.Add(48 * time.Minute)); err != nil {
		t.Fatalf("republish: %v", err)
	}
	sts.Advance(70 * time.Minute)

	env.restart()
	mu.Lock()
	if len(refused) != 0 {
		t.Errorf("refused at takeover: %q", refused)
	}
	mu.Unlock()
	checkFiles(t, target, map[string]string{"model.bin": "weights of team a", "config.json": `{"layers": 2}`})
}

// TestClaimWebIdentityRepublish: a claim of a web-identity dataset published for a pod is
// published again for it, as kubelet does while the pod runs: nothing is proved again (no
// exchange at the STS) nor mounted again, also once the source changed, which a new pod's
// publish is refused for. Before, every republish exchanged the pod's token and proved its
// access again, and was refused once the source changed.
func TestClaimWebIdentityRepublish(t *testing.T) {
	s, issuer, sts := webIdentityPeers(t, map[string][]byte{"model.bin": []byte("weights of team a")}, 0)
	env := startDriver(t, testPool{name: "fast"})
	env.stop()
	env.cfg.Datasets.STSEndpoint = sts.URL
	env.start()
	ctx := context.Background()
	vol := env.create("claim-republish", 64<<20, map[string]string{"source": "s3://private/set", "endpoint": s.Endpoint,
		"pathStyle": "true", "credentials": "webIdentity", "roleARN": republishRole, "pool": "fast"})
	staging := filepath.Join(env.dir, "staging", vol.VolumeId)
	if _, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId,
		StagingTargetPath: staging, VolumeCapability: mountCap(""), VolumeContext: vol.VolumeContext}); err != nil {
		t.Fatal(err)
	}
	publish := func(pod string) error {
		vc := maps.Clone(vol.VolumeContext)
		maps.Copy(vc, saTokens(t, issuer, "team-a/trainer", pod))
		_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging,
			TargetPath: filepath.Join(env.dir, "target", pod), VolumeCapability: mountCap(""), VolumeContext: vc, Readonly: true})
		return err
	}
	target := filepath.Join(env.dir, "target", "trainer-pod")
	t.Cleanup(func() {
		for _, pod := range []string{"trainer-pod", "late-pod"} {
			_, _ = env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: filepath.Join(env.dir, "target", pod)})
		}
		_, _ = env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging})
	})
	if err := retryUnavailable(t, func() error { return publish("trainer-pod") }); err != nil {
		t.Fatal(err)
	}
	exchanges, mounts := sts.Exchanges(), mountIDs(t, target)
	for range 3 {
		if err := publish("trainer-pod"); err != nil {
			t.Fatalf("republish: %v", err)
		}
	}
	s.Put(t, "private", "set/model.bin", []byte("weights of team a, retrained"))
	if err := publish("trainer-pod"); err != nil {
		t.Errorf("republish after the source changed: %v", err)
	}
	if sts.Exchanges() != exchanges {
		t.Errorf("the republishes exchanged the pod's token %d times, want none", sts.Exchanges()-exchanges)
	}
	if got := mountIDs(t, target); got != mounts {
		t.Errorf("the republishes changed the mounts at the target: %s, then %s", mounts, got)
	}
	checkFiles(t, target, map[string]string{"model.bin": "weights of team a"})
	// A new pod proves its own access, of the version the claim holds.
	err := retryUnavailable(t, func() error { return publish("late-pod") })
	wantCode(t, err, codes.PermissionDenied, "holds another version")
}

// mountIDs lists the IDs of the mounts at path (mountinfo), the top one last.
func mountIDs(t *testing.T, path string) string {
	t.Helper()
	infos, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range infos {
		if m.MountPoint == path {
			ids = append(ids, strconv.Itoa(m.ID))
		}
	}
	if len(ids) == 0 {
		t.Fatalf("nothing is mounted at %s", path)
	}
	return strings.Join(ids, ",")
}

// TestLogStripsServiceAccountTokens: at --v=5 the driver's interceptor logs each call's request
// with its secrets stripped, and the pod's ServiceAccount tokens kubelet puts in
// NodePublishVolume's volume context too (not a csi_secret field), while the handler gets them.
// Before, every pod's token was in the log.
func TestLogStripsServiceAccountTokens(t *testing.T) {
	env := startDriver(t, testPool{name: "fast"})
	issuer := testpeers.StartOIDCIssuer(t)
	vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://private/set", "credentials": "webIdentity", "roleARN": republishRole}
	tokens := saTokens(t, issuer, "team-a/trainer", "trainer-pod")
	maps.Copy(vc, tokens)
	req := &csi.NodePublishVolumeRequest{VolumeId: "trainer-pod", TargetPath: filepath.Join(env.dir, "target", "trainer-pod"),
		VolumeCapability: mountCap(""), VolumeContext: vc, Readonly: true}
	// The driver's own logger is klog's global one, which a test cannot swap while the driver
	// runs: the call goes through the interceptor with a logger of the test's in its context.
	var buf syncBuffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(5), textlogger.Output(&buf)))
	handled := ""
	_, err := env.driver.logAndMeasure(klog.NewContext(context.Background(), logger), req,
		&grpc.UnaryServerInfo{FullMethod: "/csi.v1.Node/NodePublishVolume"}, func(_ context.Context, r any) (any, error) {
			handled = r.(*csi.NodePublishVolumeRequest).GetVolumeContext()["csi.storage.k8s.io/serviceAccount.tokens"]
			return &csi.NodePublishVolumeResponse{}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if handled != tokens["csi.storage.k8s.io/serviceAccount.tokens"] {
		t.Errorf("the handler got tokens %q, want kubelet's", handled)
	}
	log := buf.String()
	if !strings.Contains(log, "NodePublishVolume") || !strings.Contains(log, "trainer-pod") {
		t.Fatalf("the request was not logged at V(5):\n%s", log)
	}
	token := tokenOf(t, tokens)
	if signature := token[strings.LastIndex(token, ".")+1:]; strings.Contains(log, signature) {
		t.Error("the log holds the pod's ServiceAccount token")
	}
	if !strings.Contains(log, "***stripped***") {
		t.Errorf("the log does not say the tokens were stripped:\n%s", log)
	}
}

// tokenOf is the pod's token for the STS in a volume context kubelet made.
func tokenOf(t *testing.T, volumeContext map[string]string) string {
	t.Helper()
	var tokens map[string]struct{ Token string }
	if err := json.Unmarshal([]byte(volumeContext["csi.storage.k8s.io/serviceAccount.tokens"]), &tokens); err != nil {
		t.Fatal(err)
	}
	return tokens[republishAudience].Token
}

// syncBuffer is a bytes.Buffer that the driver's goroutines may write together.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
