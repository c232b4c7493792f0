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

// TestJournalKeepsConfirmation replays and keeps (Uploader.Keep) files confirmed by a checksum and
// by an MD5 ETag (a server without flexible checksums): each comes back with how it was confirmed,
// and a multipart upload with its part size.
func TestJournalKeepsConfirmation(t *testing.T) {
	dir := t.TempDir()
	job := Job{Volume: "v", Upper: "/u", Target: Target{Bucket: "b"}}
	j, err := openJournal(dir, job)
	if err != nil {
		t.Fatal(err)
	}
	byCRC, byMD5, big := fileKey{"a", 1, 2}, fileKey{"b", 3, 4}, fileKey{"c", 40 << 20, 5}
	want := map[fileKey]proof{byCRC: {Sum: "AAAAAA=="}, byMD5: {ETag: "0cc175b9c0f1b6a831c399e269772661"},
		big: {ETag: "6e2ac5e6b2a4b3e1a8b1b8fb0f0b9d1b-5", PartSize: 8 << 20}}
	for k, p := range want {
		if err := j.append(doneRecord(k, p), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.append(record{Op: opUpload, Path: "d", Size: 9, MTime: 9, Upload: "u1", Alg: algCRC32C, PartSize: 6 << 20}, true); err != nil {
		t.Fatal(err)
	}
	if err := j.append(record{Op: opComplete}, true); err != nil {
		t.Fatal(err)
	}
	j.close()
	j, err = openJournal(dir, job)
	if err != nil {
		t.Fatal(err)
	}
	if up := j.uploadOf(fileKey{"d", 9, 9}); up == nil || up.PartSize != 6<<20 {
		t.Errorf("upload replayed as %+v, want its part size", up)
	}
	if err := j.keep(); err != nil {
		t.Fatal(err)
	}
	j.close()
	j, err = openJournal(dir, job)
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	for k, p := range want {
		if got, ok := j.storedProof(k); !ok || got != p {
			t.Errorf("%s kept as %+v (%v), want %+v", k.Path, got, ok, p)
		}
	}
	if !want[byMD5].byMD5() || want[byCRC].byMD5() {
		t.Error("byMD5 misreads a proof")
	}
}
