package datasource_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// A streaming volume and the versions of other callers (issue 37, items 2 and 4). Tenant A signs
// and reaches one versitygw, tenant B is anonymous and reaches another (perCredentialEndpoint):
// one dataset ID, two listings, every file of the same size in both, other bytes. A's staging is
// held at its gated objects (the test releases them), so it is under way while B stages.

// gatedKeys are the objects A's reads of wait for the test's release: A's staging stays under
// way, and a read of them is of a file not cached yet.
var gatedKeys = []string{"gate.bin", "late.txt"}

type streamVersions struct {
	m          *datasource.Manager
	pool       string
	reqA, reqB datasource.Request
	wantA      dataset
	wantB      dataset
	sb         *testpeers.S3
	release    chan struct{}
}

func newStreamVersions(t *testing.T, abandonAfter time.Duration) *streamVersions {
	sa, sb := testpeers.StartS3(t, ""), testpeers.StartS3(t, "")
	e := &streamVersions{sb: sb, release: make(chan struct{}), wantA: dataset{}, wantB: dataset{}}
	for i := range 12 {
		key := fmt.Sprintf("d%d/f%02d.txt", i%3, i)
		e.wantA[key], e.wantB[key] = randBytes(uint64(100+i), 4000+i), randBytes(uint64(200+i), 4000+i)
	}
	e.wantA["gate.bin"], e.wantB["gate.bin"] = randBytes(301, 1<<20), randBytes(302, 1<<20)
	e.wantA["late.txt"], e.wantB["late.txt"] = randBytes(303, 777), randBytes(304, 777)
	e.wantA["only-a.txt"] = randBytes(305, 5000) // B has none: its tree cannot stand in for it
	e.wantB["varying.txt"] = []byte("B's first edition")
	sa.Bucket(t, "shared")
	sb.Bucket(t, "shared")
	e.wantA.upload(t, sa, "shared", "set/")
	e.wantB.upload(t, sb, "shared", "set/")
	bucketPolicy(t, sb, "shared", anonymousList("shared"), anonymousRead("shared", "set/*"))
	route, _ := startPerCredentialEndpoint(t, sa, sb)
	gated := map[string]bool{}
	for _, k := range gatedKeys {
		gated["/shared/set/"+k] = true
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		signed := r.Header.Get("Authorization") != "" || r.URL.Query().Get("X-Amz-Credential") != ""
		if signed && r.Method == http.MethodGet && gated[r.URL.Path] && r.Header.Get("Range") != "bytes=0-0" {
			select {
			case <-e.release:
			case <-r.Context().Done():
				return
			}
		}
		route.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(e.open)
	e.m = newManager(t, datasource.Config{Limits: datasource.Limits{AbandonAfter: abandonAfter}})
	e.pool = t.TempDir()
	spec := mustSpec(t, s3Params(sa, srv.URL, "s3://shared/set"))
	e.reqA = datasource.Request{Spec: spec, Creds: creds(sa), Pool: e.pool}
	e.reqB = datasource.Request{Spec: spec, Pool: e.pool}
	return e
}

// open lets A's gated reads through.
func (e *streamVersions) open() {
	select {
	case <-e.release:
	default:
		close(e.release)
	}
}

// streamA serves A's dataset through a FUSE mount that joins its staging.
func (e *streamVersions) streamA(t *testing.T) (string, *datasource.Streaming, string) {
	t.Helper()
	st, ds, err := e.m.Stream(testCtx(t), e.reqA, "vol-stream-A")
	if err != nil || ds == nil {
		t.Fatalf("stream A: %v %v (a stream: %v)", st, err, ds != nil)
	}
	t.Cleanup(ds.Release)
	mnt, _ := mountStream(t, ds, true)
	return mnt, ds, st.Version
}

// readA reads keys through A's mount and counts the files that are not A's bytes.
func (e *streamVersions) readA(t *testing.T, mnt string, keys []string) (wrong, failed int) {
	t.Helper()
	for _, k := range keys {
		got, err := os.ReadFile(filepath.Join(mnt, k))
		switch {
		case err != nil:
			failed++
			t.Errorf("%s through A's streaming volume: %v", k, err)
		case !bytes.Equal(got, e.wantA[k]):
			wrong++
			t.Errorf("%s through A's streaming volume: %d bytes, not A's (B's: %v)", k, len(got), bytes.Equal(got, e.wantB[k]))
		}
	}
	return wrong, failed
}

// stageB stages B's current version and checks it is B's own bytes, want. It returns the
// version, or "" when B was refused.
func (e *streamVersions) stageB(t *testing.T, vol string, want dataset) string {
	t.Helper()
	ctx := testCtx(t)
	st, err := stage(ctx, t, e.m, e.reqB)
	if err != nil {
		t.Logf("B (%s) refused: %v", vol, err)
		return ""
	}
	tree, err := e.m.Acquire(e.pool, e.reqB.Spec, st.Version, vol)
	if err != nil {
		t.Fatalf("B (%s): %v", vol, err)
	}
	checkTree(t, tree, want)
	if err := e.m.ReleaseID(e.pool, e.reqB.Spec.ID(), vol); err != nil {
		t.Fatal(err)
	}
	return st.Version
}

func keysOf(d dataset, except ...string) []string {
	var out []string
	for k := range d {
		if !slices.Contains(except, k) {
			out = append(out, k)
		}
	}
	return out
}

// TestStreamingVolumeKeepsItsVersion: A's streaming volume is served while its staging is held
// at the gated objects; nobody asks for the dataset for longer than --staging-abandon-after (1 s
// here) while B, whose listing differs, stages its own version. A's mount serves A's bytes only,
// every file (the cached ones from the version's directory it holds, the gated ones once let
// through: its staging was kept alive by the volume, no EIO), and A's staging ends as A's
// version. Before, the staging was abandoned, its directory deleted and B's version staged in
// the same place, which A's mount then served.
func TestStreamingVolumeKeepsItsVersion(t *testing.T) {
	const abandonAfter = time.Second
	e := newStreamVersions(t, abandonAfter)
	mnt, ds, versionA := e.streamA(t)
	// The interest watcher looks every abandonAfter/4: it has had its chance to abandon a
	// staging nobody asks for.
	time.Sleep(4 * abandonAfter)
	versionB := e.stageB(t, "vol-B", e.wantB)
	if versionB == "" || versionB == versionA {
		t.Fatalf("B was served version %q, A streams %q", versionB, versionA)
	}
	wrong, failed := e.readA(t, mnt, keysOf(e.wantA, gatedKeys...))
	e.open()
	w, f := e.readA(t, mnt, gatedKeys)
	wrong, failed = wrong+w, failed+f
	t.Logf("A's streaming volume, after B staged its version: %d files read, %d not A's bytes, %d failed", len(e.wantA), wrong, failed)
	st, err := stage(testCtx(t), t, e.m, e.reqA)
	if err != nil || st.Version != versionA {
		t.Fatalf("A's staging: %+v %v, want A's version %s", st, err, versionA)
	}
	ds.Release()
	if exists(ds.Scratch) {
		t.Errorf("A's scratch %s is left after release", ds.Scratch)
	}
}

// TestStreamingVolumeLeavesOthersTheirVersions: while A's streaming volume is open, B's listing
// changes ten times (an object B sees is rewritten before each attempt): five attempts while A's
// staging is under way, five after it ended with A's volume still reading its version. Every
// attempt of B is staged as its own version and serves B's bytes; A's mount still serves A's.
// Before, B was refused for as long as A's volume lived: "a staging of other data is under way",
// then "the cached version is being copied into a volume".
func TestStreamingVolumeLeavesOthersTheirVersions(t *testing.T) {
	e := newStreamVersions(t, 0)
	mnt, ds, versionA := e.streamA(t)
	seen := map[string]bool{versionA: true}
	staged := 0
	const attempts = 10
	for k := range attempts {
		if k == attempts/2 {
			e.open()
			if st, err := stage(testCtx(t), t, e.m, e.reqA); err != nil || st.Version != versionA {
				t.Fatalf("A's staging: %+v %v, want A's version %s", st, err, versionA)
			}
		}
		want := dataset{}
		for key, v := range e.wantB {
			want[key] = v
		}
		want["varying.txt"] = []byte(fmt.Sprintf("B's edition %d", k))
		e.sb.Put(t, "shared", "set/varying.txt", want["varying.txt"])
		v := e.stageB(t, fmt.Sprintf("vol-B-%d", k), want)
		switch {
		case v == "":
		case seen[v]:
			t.Errorf("attempt %d: B was served version %s, not a new one of its own", k+1, v)
		default:
			staged++
			seen[v] = true
		}
	}
	wrong, failed := e.readA(t, mnt, keysOf(e.wantA))
	t.Logf("while A's streaming volume was open, %d of %d attempts of B with its own listing were staged as its own version; A's volume then read %d files: %d not A's, %d failed",
		staged, attempts, len(e.wantA), wrong, failed)
	if staged != attempts {
		t.Errorf("%d of %d attempts of B staged, want all", staged, attempts)
	}
	ds.Release()
	if left, _ := filepath.Glob(filepath.Join(e.pool, datasource.CacheDirName, "*.retired-*")); len(left) != 0 {
		t.Errorf("retired versions left after A's volume let go: %v", left)
	}
}
