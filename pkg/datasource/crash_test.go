package datasource_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// stagingChild is the staging process TestCrashResume kills and restarts.
func stagingChild(t *testing.T) {
	var params map[string]string
	if err := json.Unmarshal([]byte(os.Getenv("CISTERN_CRASH_PARAMS")), &params); err != nil {
		t.Fatal(err)
	}
	c, err := datasource.CredentialsFromSecrets(map[string]string{
		"accessKeyID": os.Getenv("CISTERN_CRASH_AK"), "secretAccessKey": os.Getenv("CISTERN_CRASH_SK"),
	})
	if err != nil {
		t.Fatal(err)
	}
	m := newManager(t, datasource.Config{Concurrency: 2, ChunkSize: 1 << 20})
	if _, err := stage(testCtx(t), t, m, datasource.Request{Spec: mustSpec(t, params), Creds: c, Pool: os.Getenv("CISTERN_CRASH_POOL")}); err != nil {
		t.Fatal(err)
	}
}

// TestCrashResume kills a staging process mid-download, restarts it, and checks the dataset ends
// byte-identical, that nothing was published before it was complete, and that objects completed
// before the crash were not fetched again.
func TestCrashResume(t *testing.T) {
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	want := smallTree(11, 40, 256<<10)
	want.upload(t, s, "data", "")
	big := randBytes(12, 11<<20)
	s.PutMultipart(t, "data", "big.bin", int64(len(big)), 5<<20, func(i int, buf []byte) { copy(buf, big[i*(5<<20):]) })
	want["big.bin"] = big

	proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method == http.MethodGet && !r.URL.Query().Has("list-type") {
			return testpeers.Fault{Delay: 100 * time.Millisecond, ResetAfter: -1}
		}
		return testpeers.None
	})
	pool := t.TempDir()
	params, _ := json.Marshal(s3Params(s, proxy.URL, "s3://data"))
	spec := mustSpec(t, s3Params(s, proxy.URL, "s3://data"))
	dsDir := filepath.Join(pool, datasource.CacheDirName, spec.ID())
	child := func() (*exec.Cmd, *bytes.Buffer) {
		cmd := testutil.ChildCommand("staging", "CISTERN_CRASH_PARAMS="+string(params),
			"CISTERN_CRASH_AK="+s.AccessKey, "CISTERN_CRASH_SK="+s.SecretKey, "CISTERN_CRASH_POOL="+pool)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
		return cmd, &out
	}

	cmd, out := child()
	deadline := time.Now().Add(2 * time.Minute)
	for len(stagedFiles(t, dsDir)) < 15 {
		if time.Now().After(deadline) {
			t.Fatalf("child made no progress: %s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_, _ = cmd.Process.Wait()
	done := stagedFiles(t, dsDir)
	if exists(filepath.Join(dsDir, "tree")) {
		t.Fatal("a dataset was published before it was complete")
	}
	if len(done) == len(want) {
		t.Fatal("the child finished before it was killed; the test proves nothing")
	}
	before := map[string]int{}
	for _, k := range done {
		before[k] = proxy.Gets("/data/" + k)
	}
	t.Logf("killed with %d of %d objects staged", len(done), len(want))
	var size int64
	for _, v := range want {
		size += int64(len(v))
	}
	// The node's inventory, read by a new process, shows the partial dataset, to be resumed.
	if d := findDataset(inventory(t, newManager(t, datasource.Config{}), pool, 0), spec.ID()); d == nil ||
		d.State != datasource.DatasetIncomplete || d.BytesTotal != size || d.Source != spec.Source {
		t.Errorf("inventory after the crash: %+v", d)
	}

	// The resuming caller proves it reads the same data (package access): its listing, and one byte of
	// one file. That byte is not a fetch; every other read of a staged file would be.
	var mu sync.Mutex
	proofReads := map[string]int{}
	proxy.SetFaults(func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method == http.MethodGet && r.Header.Get("Range") == "bytes=0-0" {
			mu.Lock()
			proofReads[r.URL.Path]++
			mu.Unlock()
		}
		return testpeers.None
	})
	cmd, out = child()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("restarted staging failed: %v\n%s", err, out)
	}
	checkTree(t, filepath.Join(dsDir, "tree"), want)
	proofs := 0
	for _, k := range done {
		p := proofReads["/data/"+k]
		proofs += p
		if n := proxy.Gets("/data/" + k); n != before[k]+p {
			t.Errorf("%s fetched again after the restart (%d GETs, %d before, %d one-byte proof reads)", k, n, before[k], p)
		}
	}
	if proofs > 1 {
		t.Errorf("%d proof reads of staged files, want at most one", proofs)
	}
}

func stagedFiles(t *testing.T, dsDir string) []string {
	var out []string
	root := filepath.Join(dsDir, "staging")
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			rel, _ := filepath.Rel(root, p)
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	return out
}

var (
	_ = context.Background
	_ = strings.Contains
)
