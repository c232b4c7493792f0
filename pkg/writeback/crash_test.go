package writeback_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/pkg/writeback"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// crashJob is what TestCrashResume's child runs.
type crashJob struct {
	Endpoint, AccessKey, SecretKey, Journal string
	Job                                     writeback.Job
}

func crashConfig(dir string) writeback.Config {
	return writeback.Config{Dir: dir, PartSize: 5 << 20, Concurrency: 4}
}

func TestMain(m *testing.M) {
	testutil.RunChild(map[string]func(*testing.T){"upload": uploadChild})
	os.Exit(m.Run())
}

// uploadChild is the uploading process TestCrashResume kills.
func uploadChild(t *testing.T) {
	var c crashJob
	if err := json.Unmarshal([]byte(os.Getenv("CISTERN_WRITEBACK_JOB")), &c); err != nil {
		t.Fatal(err)
	}
	u, err := writeback.New(crashConfig(c.Journal))
	if err != nil {
		t.Fatal(err)
	}
	s := &testpeers.S3{AccessKey: c.AccessKey, SecretKey: c.SecretKey}
	if err := u.Run(testCtx(t), c.Job, clientFor(s, c.Endpoint), nil); err != nil {
		t.Fatal(err)
	}
}

// TestCrashResume SIGKILLs an uploading process mid-upload and runs the job again: it completes
// with every object byte-identical, nothing that the target held is sent again, and no
// multipart upload is left open (nothing duplicated, nothing lost).
func TestCrashResume(t *testing.T) {
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "out")
	// Slow writes, so that the kill lands mid-upload.
	proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method == http.MethodPut {
			return testpeers.Fault{Delay: 60 * time.Millisecond, ResetAfter: -1}
		}
		return testpeers.None
	})
	upper := t.TempDir()
	want := map[string][]byte{"big.bin": randBytes(5, 61<<20+3)}
	for i := range 40 {
		want[fmt.Sprintf("small/%02d", i)] = randBytes(uint64(10+i), 100<<10)
	}
	var total int64
	for p, b := range want {
		writeFile(t, filepath.Join(upper, p), b)
		total += int64(len(b))
	}
	journal := t.TempDir()
	job := writeback.Job{Volume: "pvc-1", Upper: upper, Target: writeback.Target{Bucket: "out", Prefix: "o/"}}
	params, _ := json.Marshal(crashJob{Endpoint: proxy.URL, AccessKey: s.AccessKey, SecretKey: s.SecretKey, Journal: journal, Job: job})
	cmd := testutil.ChildCommand("upload", "CISTERN_WRITEBACK_JOB="+string(params))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
	// Kill once the journal records some parts of the big file, and some small files.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		log, _ := os.ReadFile(filepath.Join(journal, "pvc-1", "log"))
		if strings.Count(string(log), `"op":"part"`) >= 4 && strings.Count(string(log), `"op":"done"`) >= 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child recorded too little: %s\n%s", log, out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_, _ = cmd.Process.Wait()
	if got := objects(t, s.Client, "out", "o/"); len(got) >= len(want) {
		t.Fatalf("the child finished before it was killed (%d objects)", len(got))
	}

	u, err := writeback.New(crashConfig(journal))
	if err != nil {
		t.Fatal(err)
	}
	pending, err := u.Pending()
	if err != nil || len(pending) != 1 || pending[0] != job {
		t.Fatalf("pending after the crash: %+v, %v", pending, err)
	}
	var last writeback.Progress
	if err := u.Run(testCtx(t), pending[0], clientFor(s, s.Endpoint), func(p writeback.Progress) { last = p }); err != nil {
		t.Fatal(err)
	}
	sameObjects(t, objects(t, s.Client, "out", "o/"), want)
	if !last.Done || last.Sent >= total-4*(5<<20) || last.BytesDone != total {
		t.Errorf("resumed: %+v; want done, at least the 4 recorded parts not sent again (total %d)", last, total)
	}
	if n := openUploads(t, s.Client, "out"); n != 0 {
		t.Errorf("%d multipart uploads left open", n)
	}
	t.Logf("resumed: sent %d of %d bytes", last.Sent, total)
}
