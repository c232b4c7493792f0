package writeback_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/cistern-csi/cistern/pkg/writeback"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// TestKeptJobSendsOnlyChanges runs three jobs of one volume that stays (a claim written again
// between them), each kept (Keep) when complete: the second sends only the file the pod changed,
// the file it made, and the one whose object was deleted at the target meanwhile, and deletes the
// object of the file the pod removed; the third, nothing changed, sends nothing. A kept journal
// is no job to run or resume, and DeleteVolume's Forget removes it.
func TestKeptJobSendsOnlyChanges(t *testing.T) {
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "out")
	upper := t.TempDir()
	files := map[string][]byte{"small.txt": randBytes(1, 1<<10), "big.bin": randBytes(2, 12<<20+5),
		"same.txt": randBytes(3, 4<<10), "gone.txt": []byte("gone")}
	for p, b := range files {
		writeFile(t, filepath.Join(upper, p), b)
	}
	u, err := writeback.New(writeback.Config{Dir: t.TempDir(), PartSize: 5 << 20})
	if err != nil {
		t.Fatal(err)
	}
	job := writeback.Job{Volume: "claim", Upper: upper, Target: writeback.Target{Bucket: "out", Prefix: "w/"}, Deletes: true}
	round := func(name string) writeback.Progress {
		t.Helper()
		if err := u.Add(job); err != nil {
			t.Fatal(err)
		}
		if done, _ := u.Done("claim"); done {
			t.Fatalf("%s: Done before it ran", name)
		}
		var last writeback.Progress
		if err := u.Run(testCtx(t), job, s.Client, func(p writeback.Progress) { last = p }); err != nil {
			t.Fatal(err)
		}
		sameObjects(t, objects(t, s.Client, "out", "w/"), files)
		if err := u.Keep("claim"); err != nil {
			t.Fatal(err)
		}
		if err := u.Keep("claim"); err != nil {
			t.Fatalf("%s: Keep again: %v", name, err)
		}
		if done, err := u.Done("claim"); err != nil || !done {
			t.Errorf("%s: kept, Done = %v, %v; want done", name, done, err)
		}
		jobs, _ := u.Jobs()
		pending, _ := u.Pending()
		if len(jobs)+len(pending) != 0 {
			t.Errorf("%s: kept, %d jobs and %d pending, want none", name, len(jobs), len(pending))
		}
		return last
	}

	first := round("first job")
	if want := int64(len(files["small.txt"]) + len(files["big.bin"]) + len(files["same.txt"]) + len(files["gone.txt"])); first.Sent != want {
		t.Errorf("first job sent %d bytes, want %d", first.Sent, want)
	}

	// The pod changes one file, makes one and removes one; same.txt's object is deleted at the
	// target by someone else.
	files["small.txt"] = randBytes(4, 1<<10)
	files["new.txt"] = randBytes(5, 2<<10)
	for _, p := range []string{"small.txt", "new.txt"} {
		writeFile(t, filepath.Join(upper, p), files[p])
	}
	if err := os.Remove(filepath.Join(upper, "gone.txt")); err != nil {
		t.Fatal(err)
	}
	delete(files, "gone.txt")
	if _, err := s.Client.DeleteObject(testCtx(t), &s3.DeleteObjectInput{Bucket: aws.String("out"), Key: aws.String("w/same.txt")}); err != nil {
		t.Fatal(err)
	}
	second := round("second job")
	if want := int64(len(files["small.txt"]) + len(files["new.txt"]) + len(files["same.txt"])); second.Sent != want {
		t.Errorf("second job sent %d bytes, want %d: the changed, new and missing files only (not big.bin again)", second.Sent, want)
	}
	if second.FilesDone != len(files) || second.DeletesDone != 1 {
		t.Errorf("second job: %+v, want %d files done, gone.txt's object deleted", second, len(files))
	}

	third := round("third job")
	if third.Sent != 0 || third.FilesDone != len(files) {
		t.Errorf("third job, nothing changed: %+v, want nothing sent, every file done", third)
	}

	// A job complete but not kept (the plugin stopped before Keep): the next hand-off keeps it
	// first, and its job sends only what changed since.
	run := func() writeback.Progress {
		t.Helper()
		if err := u.Add(job); err != nil {
			t.Fatal(err)
		}
		var last writeback.Progress
		if err := u.Run(testCtx(t), job, s.Client, func(p writeback.Progress) { last = p }); err != nil {
			t.Fatal(err)
		}
		return last
	}
	files["small.txt"] = randBytes(6, 1<<10)
	writeFile(t, filepath.Join(upper, "small.txt"), files["small.txt"])
	run() // complete, not kept
	files["new.txt"] = randBytes(7, 2<<10)
	writeFile(t, filepath.Join(upper, "new.txt"), files["new.txt"])
	if last := run(); !last.Done || last.Sent != int64(len(files["new.txt"])) {
		t.Errorf("the job after one not kept: %+v, want done with only new.txt's %d bytes sent", last, len(files["new.txt"]))
	}
	sameObjects(t, objects(t, s.Client, "out", "w/"), files)

	if err := u.Forget("claim"); err != nil {
		t.Fatal(err)
	}
	if err := u.Keep("no-such-volume"); err != nil {
		t.Errorf("Keep of a volume without a journal: %v", err)
	}
	if jobs, _ := u.Jobs(); slices.ContainsFunc(jobs, func(j writeback.Job) bool { return j.Volume == "claim" }) {
		t.Error("a forgotten journal is still listed")
	}
}
