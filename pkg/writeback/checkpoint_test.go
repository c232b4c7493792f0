package writeback_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/pkg/writeback"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// TestCheckpointFileBeingWritten has the pod write two files (one small, one multipart) while a
// checkpoint sends them: the checkpoint leaves both for the next round, and neither shows torn at
// the target (absent, or whole as it was). The next checkpoint uploads what they hold now and
// aborts the multipart upload left open; the final upload then has nothing left to send.
func TestCheckpointFileBeingWritten(t *testing.T) {
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "out")
	upper := t.TempDir()
	old := map[string][]byte{"small.txt": randBytes(7, 1<<10), "big.bin": randBytes(8, 12<<20)}
	now := map[string][]byte{"small.txt": randBytes(9, 1<<10), "big.bin": randBytes(10, 12<<20)}
	past := func() {
		for p := range old {
			ago := time.Now().Add(-time.Minute)
			if err := os.Chtimes(filepath.Join(upper, p), ago, ago); err != nil {
				t.Fatal(err)
			}
		}
	}
	for p, b := range old {
		writeFile(t, filepath.Join(upper, p), b)
	}
	past() // written long enough ago to be taken by a checkpoint
	var (
		mu      sync.Mutex
		written = map[string]bool{}
	)
	// The pod writes each file again as its first request arrives at the server.
	proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method != http.MethodPut {
			return testpeers.None
		}
		mu.Lock()
		defer mu.Unlock()
		for p, b := range now {
			if strings.HasSuffix(r.URL.Path, "/"+p) && !written[p] {
				written[p] = true
				if err := os.WriteFile(filepath.Join(upper, p), b, 0o644); err != nil {
					t.Error(err)
				}
			}
		}
		return testpeers.None
	})
	u, err := writeback.New(writeback.Config{Dir: t.TempDir(), PartSize: 5 << 20})
	if err != nil {
		t.Fatal(err)
	}
	job := writeback.Job{Volume: "v", Upper: upper, Target: writeback.Target{Bucket: "out"}}
	client := clientFor(s, proxy.URL)
	var last writeback.Progress
	report := func(p writeback.Progress) { last = p }
	if err := u.Checkpoint(testCtx(t), job, client, report); err != nil {
		t.Fatal(err)
	}
	if last.Deferred != 2 || last.FilesDone != 0 {
		t.Errorf("first checkpoint: %+v, want both files left for the next round", last)
	}
	for p, b := range objects(t, s.Client, "out", "") {
		if string(b) != string(old[p]) && string(b) != string(now[p]) {
			t.Errorf("%s: %d bytes at the target are neither what the file held nor what it holds", p, len(b))
		}
		if p == "big.bin" {
			t.Error("big.bin: a multipart upload was completed while the file was written")
		}
	}
	if ok, _ := u.Done("v"); !ok {
		t.Error("a volume in use holds back its deletion (Done false)")
	}
	if jobs, _ := u.Jobs(); len(jobs) != 0 {
		t.Errorf("a volume in use is listed to resume: %+v", jobs)
	}

	past()
	if err := u.Checkpoint(testCtx(t), job, client, report); err != nil {
		t.Fatal(err)
	}
	if last.Deferred != 0 || last.FilesDone != 2 {
		t.Errorf("second checkpoint: %+v, want both files uploaded", last)
	}
	sameObjects(t, objects(t, s.Client, "out", ""), now)
	if n := openUploads(t, s.Client, "out"); n != 0 {
		t.Errorf("%d multipart uploads left open", n)
	}

	// The pod lets the volume go: the final upload sends only what is left, here nothing.
	if err := u.Add(job); err != nil {
		t.Fatal(err)
	}
	if ok, _ := u.Done("v"); ok {
		t.Error("Done before the final upload")
	}
	if err := u.Run(testCtx(t), job, client, report); err != nil {
		t.Fatal(err)
	}
	if !last.Done || last.Sent != 0 || last.FilesDone != 2 {
		t.Errorf("final upload: %+v, want done with nothing sent", last)
	}
}
