package writeback

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/cistern-csi/cistern/pkg/atomicfile"
)

// The journal of one job is a directory: job.json, the job as it was asked (written once,
// durably, before anything is uploaded), and log, one JSON record a line, appended. A crash can
// tear only the last line, which is dropped on reading. Records that must survive a crash (a
// multipart upload started: it costs storage on the server until completed or aborted; the job
// complete: the caller then deletes the data) are synced at once; a file's "done" is synced with
// the next synced record. A "done" lost in a crash only makes that file upload again to the same
// key with the same bytes: nothing is lost, and no object is duplicated.
const (
	jobFile = "job.json"
	logFile = "log"
)

// op is what a record says.
type op string

const (
	opDone     op = "done"     // a file's object is at the target, whole, confirmed (Confirm)
	opUpload   op = "upload"   // a multipart upload started for a file
	opPart     op = "part"     // one part of it is at the target
	opAborted  op = "aborted"  // a multipart upload no file will complete was aborted
	opDeleted  op = "deleted"  // a path's objects are deleted at the target
	opComplete op = "complete" // every change is at the target
	// opCheckpoint starts a checkpoint, an upload while the volume is in use (synced): a
	// journal with checkpoints and no handoff is a volume still in use, not a job to resume.
	opCheckpoint op = "checkpoint"
	// opHandoff records the volume let go and its final upload asked for (synced), and when
	// (At): an upload's age limit counts from it.
	opHandoff op = "handoff"
	// opExpired ends a job that was pending past its age limit (Uploader.Expire): nothing
	// resumes it, and it holds the volume no more; a later hand-off goes on from the journal.
	opExpired op = "expired"
	// opKept ends a complete job of a volume that stays (Uploader.Keep): the files recorded
	// done before it are at the target as the volume's next job starts (stored), which sends
	// them again only when changed or no longer there.
	opKept op = "kept"
)

// record is one line of the log. Size and MTime identify the file's content: a file recorded
// done whose size or mtime differ since is uploaded again.
type record struct {
	Op     op     `json:"op"`
	Path   string `json:"path,omitempty"`
	Size   int64  `json:"size,omitempty"`
	MTime  int64  `json:"mtime,omitempty"`
	Upload string `json:"upload,omitempty"`
	Part   int32  `json:"part,omitempty"`
	ETag   string `json:"etag,omitempty"`
	Sum    string `json:"sum,omitempty"` // base64, as S3 spells it: of the upload's Alg for a part
	// Confirm is how the server confirmed a file's object or a part (checksum.go, proof): ""
	// by its checksum (Sum), confirmMD5 by an ETag that is the MD5 of the bytes (ETag; a part's
	// Sum is then the checksum sent, which the server did not answer). A resumed upload keeps
	// to it, and the next job's probe of what the target holds (stillStored) checks it.
	Confirm string `json:"confirm,omitempty"`
	// PartSize is the part size of a multipart upload (its opUpload and opDone): a resumed
	// upload keeps it, and a multipart ETag is checked with it. 0 in journals written before.
	PartSize int64 `json:"partSize,omitempty"`
	// Alg is a multipart upload's checksum algorithm; empty in journals written before CRC-32C,
	// whose uploads were started with CRC-64/NVME.
	Alg sumAlg `json:"alg,omitempty"`
	// At is a hand-off's time (Unix seconds); 0 in journals written before it was recorded.
	At int64 `json:"at,omitempty"`
}

// proof is how a done record says the server confirmed its object.
func (r record) proof() proof {
	p := proof{Sum: r.Sum, PartSize: r.PartSize}
	if r.Confirm == confirmMD5 {
		p.Sum, p.ETag = "", r.ETag
	}
	return p
}

// doneRecord records k's object at the target, confirmed by p.
func doneRecord(k fileKey, p proof) record {
	r := record{Op: opDone, Path: k.Path, Size: k.Size, MTime: k.MTime, Sum: p.Sum, PartSize: p.PartSize}
	if p.byMD5() {
		r.Confirm, r.ETag = confirmMD5, p.ETag
	}
	return r
}

// fileKey identifies a file's content in the journal.
type fileKey struct {
	Path        string
	Size, MTime int64
}

// upload is a multipart upload under way, as the journal knows it.
type upload struct {
	ID       string
	Alg      sumAlg
	PartSize int64 // 0: started by a journal that did not record it
	Parts    map[int32]record
}

// journal is a job's journal, open for appending.
type journal struct {
	dir string

	mu       sync.Mutex
	f        *os.File
	done     map[fileKey]proof
	uploads  map[fileKey]*upload
	deleted  map[string]bool
	complete bool
	// live: checkpoints were taken and the volume was not handed off yet.
	live bool
	// stored are the files an earlier job of the volume put at the target, and kept says no job
	// runs since (opKept).
	stored map[fileKey]proof
	kept   bool
}

// openJournal opens (creating when new) the journal of job in dir. A job.json that differs from
// job is refused: one volume's journal is never resumed for another job.
func openJournal(dir string, job Job) (*journal, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	want, err := json.Marshal(job)
	if err != nil {
		return nil, err
	}
	have, err := os.ReadFile(filepath.Join(dir, jobFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := atomicfile.Write(filepath.Join(dir, jobFile), ".job-", func(f *os.File) error {
			_, err := f.Write(want)
			return err
		}); err != nil {
			return nil, err
		}
		if err := atomicfile.SyncDir(dir); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	case !bytes.Equal(have, want):
		return nil, fmt.Errorf("journal %s is of another job: %s", dir, have)
	}
	j := &journal{dir: dir, done: map[fileKey]proof{}, uploads: map[fileKey]*upload{}, deleted: map[string]bool{},
		stored: map[fileKey]proof{}}
	if err := j.load(); err != nil {
		return nil, err
	}
	j.f, err = os.OpenFile(filepath.Join(dir, logFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	return j, nil
}

// load replays the log. A torn last line (a crash mid-append) is cut off, so that the next
// record starts on a line of its own.
func (j *journal) load() error {
	p := filepath.Join(j.dir, logFile)
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	good := 0
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var r record
		if good+len(line) >= len(data) || json.Unmarshal(line, &r) != nil {
			break // no newline after it, or torn: a crash mid-append
		}
		j.apply(r)
		good += len(line) + 1
	}
	if good < len(data) {
		return os.Truncate(p, int64(good))
	}
	return nil
}

func (j *journal) apply(r record) {
	k := fileKey{r.Path, r.Size, r.MTime}
	switch r.Op {
	case opDone:
		j.done[k] = r.proof()
		delete(j.uploads, k)
		delete(j.deleted, r.Path) // made again after it was deleted (checkpoints)
	case opUpload:
		alg := r.Alg
		if alg == "" {
			alg = algCRC64NVME
		}
		j.uploads[k] = &upload{ID: r.Upload, Alg: alg, PartSize: r.PartSize, Parts: map[int32]record{}}
	case opPart:
		if u := j.uploads[k]; u != nil && u.ID == r.Upload {
			u.Parts[r.Part] = r
		}
	case opAborted:
		delete(j.uploads, k)
	case opDeleted:
		j.deleted[r.Path] = true
		for _, m := range []map[fileKey]proof{j.done, j.stored} {
			for k := range m {
				if k.Path == r.Path {
					delete(m, k)
				}
			}
		}
	case opComplete:
		j.complete = true
	case opCheckpoint:
		j.live, j.kept = !j.complete, false
	case opHandoff:
		j.live, j.kept = false, false
	case opExpired:
		j.live = false
	case opKept:
		for k, p := range j.done {
			j.stored[k] = p
		}
		j.done, j.uploads, j.deleted = map[fileKey]proof{}, map[fileKey]*upload{}, map[string]bool{}
		j.complete, j.live, j.kept = false, false, true
	}
}

// donePaths are the paths of the files whose objects the journal put at the target, in this job
// or an earlier one of the volume (stored).
func (j *journal) donePaths() map[string]bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make(map[string]bool, len(j.done)+len(j.stored))
	for _, m := range []map[fileKey]proof{j.done, j.stored} {
		for k := range m {
			out[k.Path] = true
		}
	}
	return out
}

// append records r; sync makes it (and every record before it) durable before returning. The
// fsync runs outside the lock: on a disk busy with the server's writes one took 35 ms on
// average (101 of them, 3.5 s, in an upload of 100 × 64 MiB), and every part's record waited
// behind it while its request slot stayed taken. r is applied once it is as durable as asked,
// so that what the journal answers (a job complete) is never ahead of the disk.
func (j *journal) append(r record, sync bool) error {
	line, err := json.Marshal(r)
	if err != nil {
		return err
	}
	j.mu.Lock()
	_, err = j.f.Write(append(line, '\n'))
	j.mu.Unlock()
	if err != nil {
		return err
	}
	if sync {
		if err := j.f.Sync(); err != nil {
			return err
		}
	}
	j.mu.Lock()
	j.apply(r)
	j.mu.Unlock()
	return nil
}

// isDone reports whether k's content is at the target.
func (j *journal) isDone(k fileKey) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	_, ok := j.done[k]
	return ok
}

// keep ends a complete job of a volume that stays (Uploader.Keep): the log is rewritten, at
// once, to the records of the files at the target followed by opKept, and appended to from then
// on.
func (j *journal) keep() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	var log bytes.Buffer
	enc := json.NewEncoder(&log)
	for k, p := range j.done {
		if err := enc.Encode(doneRecord(k, p)); err != nil {
			return err
		}
	}
	if err := enc.Encode(record{Op: opKept}); err != nil {
		return err
	}
	path := filepath.Join(j.dir, logFile)
	if err := atomicfile.Write(path, ".log-", func(f *os.File) error {
		_, err := f.Write(log.Bytes())
		return err
	}); err != nil {
		return err
	}
	if err := atomicfile.SyncDir(j.dir); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	_ = j.f.Close() // the log replaced
	j.f = f
	j.apply(record{Op: opKept})
	return nil
}

// storedProof is how the server confirmed k's object as an earlier job put it at the target,
// when k's content is what that job uploaded.
func (j *journal) storedProof(k fileKey) (proof, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	p, ok := j.stored[k]
	return p, ok
}

// uploadOf returns a copy of k's multipart upload under way, nil when none.
func (j *journal) uploadOf(k fileKey) *upload {
	j.mu.Lock()
	defer j.mu.Unlock()
	u := j.uploads[k]
	if u == nil {
		return nil
	}
	c := &upload{ID: u.ID, Alg: u.Alg, PartSize: u.PartSize, Parts: make(map[int32]record, len(u.Parts))}
	for n, p := range u.Parts {
		c.Parts[n] = p
	}
	return c
}

// staleUploads returns the multipart uploads the journal started that no current file will
// complete (the file changed or went), to abort.
func (j *journal) staleUploads(current map[fileKey]bool) map[fileKey]string {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := map[fileKey]string{}
	for k, u := range j.uploads {
		if !current[k] {
			out[k] = u.ID
		}
	}
	return out
}

func (j *journal) isDeleted(p string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.deleted[p]
}

func (j *journal) isComplete() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.complete
}

// sync makes every record appended so far durable.
func (j *journal) sync() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.f.Sync()
}

func (j *journal) close() error { return j.f.Close() }

// readJob reads the job a journal directory is for.
func readJob(dir string) (Job, error) {
	var job Job
	data, err := os.ReadFile(filepath.Join(dir, jobFile))
	if err != nil {
		return job, err
	}
	return job, json.Unmarshal(data, &job)
}
