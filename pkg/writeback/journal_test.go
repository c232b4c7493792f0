package writeback

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestJournalTornTail replays a log whose last record a crash cut short: the whole records count,
// the torn one is cut off, and the next record starts on its own line.
func TestJournalTornTail(t *testing.T) {
	dir := t.TempDir()
	job := Job{Volume: "v", Upper: "/u", Target: Target{Bucket: "b"}}
	j, err := openJournal(dir, job)
	if err != nil {
		t.Fatal(err)
	}
	a := fileKey{Path: "a", Size: 1, MTime: 2}
	if err := j.append(record{Op: opDone, Path: a.Path, Size: a.Size, MTime: a.MTime, Sum: "x"}, true); err != nil {
		t.Fatal(err)
	}
	j.close()
	f, err := os.OpenFile(filepath.Join(dir, logFile), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString(`{"op":"done","path":"b","si`)
	f.Close()

	j, err = openJournal(dir, job)
	if err != nil {
		t.Fatal(err)
	}
	if !j.isDone(a) || len(j.done) != 1 {
		t.Fatalf("replayed %v, want a only", j.done)
	}
	if err := j.append(record{Op: opComplete}, true); err != nil {
		t.Fatal(err)
	}
	j.close()
	j, err = openJournal(dir, job)
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	if !j.isComplete() || !j.isDone(a) {
		t.Error("a record after a torn tail was lost")
	}
	if _, err := openJournal(dir, Job{Volume: "v", Upper: "/other", Target: Target{Bucket: "b"}}); err == nil {
		t.Error("a journal was resumed for another job")
	}
}

// TestJournalExpired: a handed-off job records when; once expired it holds the volume no more
// and is not resumed, what it put at the target still recorded, and a later hand-off of the same
// job makes it pending again.
func TestJournalExpired(t *testing.T) {
	u, err := New(Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	job := Job{Volume: "v", Upper: "/u", Target: Target{Bucket: "b"}}
	before := time.Now().Add(-time.Second)
	if err := u.Add(job); err != nil {
		t.Fatal(err)
	}
	if at := u.HandedOff("v"); at.Before(before) || at.After(time.Now()) {
		t.Errorf("handed off at %v, want now", at)
	}
	if done, _ := u.Done("v"); done {
		t.Fatal("a handed-off job is done")
	}
	if err := u.Expire("v"); err != nil {
		t.Fatal(err)
	}
	if done, _ := u.Done("v"); !done {
		t.Error("an expired job still holds its volume")
	}
	if jobs, _ := u.Jobs(); len(jobs) != 0 {
		t.Errorf("an expired job is resumed: %v", jobs)
	}
	if err := u.Add(job); err != nil {
		t.Fatal(err)
	}
	if jobs, _ := u.Jobs(); len(jobs) != 1 {
		t.Errorf("handed off again after it expired: jobs %v, want it", jobs)
	}
}
