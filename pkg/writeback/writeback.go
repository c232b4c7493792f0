// Package writeback uploads what the pods of a writable dataset volume created or changed (and,
// when asked, deleted) to an S3 prefix, after they let the volume go (docs/datasets.md,
// "Write-back"). It reads the overlay's upper directory (pkg/overlayfs), so unchanged dataset
// files are never uploaded; large files go in parts; each body goes with its CRC-32C and MD5,
// which the server verifies, and the server's answer confirms what it holds (checksum.go); a
// journal per volume (journal.go) lets a restarted node plugin resume where it stopped, with
// nothing lost or uploaded twice; a target that refuses is retried with backoff for as long as
// the caller lets Run go on. The caller deletes the volume's data only once Done says so.
package writeback

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Target receives a volume's outputs: an S3 prefix (Bucket), or a directory of an NFS server
// (Host, and the directory's path from the server's root in Prefix; nfs.go).
type Target struct {
	Bucket string `json:"bucket,omitempty"`
	Host   string `json:"host,omitempty"`
	Prefix string `json:"prefix,omitempty"` // "" or ending in "/"
	// Namespace, for an NFS target, confines it to the directory of that name right under the
	// export: Prefix's path below the export is written below <export>/<Namespace>/ (nfs.go).
	// Every tenant writes as the node's one NFS identity; this keeps each to its own directory.
	Namespace string `json:"namespace,omitempty"`
}

// ParseTarget reads s3://bucket[/prefix] or nfs://server[:port]/export[/path].
func ParseTarget(s string) (Target, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "s3" && u.Scheme != "nfs") || u.Host == "" {
		return Target{}, fmt.Errorf("output target %q is not s3://bucket[/prefix] or nfs://server/export[/path]", s)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return Target{}, fmt.Errorf("output target %q must be s3://bucket[/prefix] or nfs://server/export[/path], without credentials, query or fragment", s)
	}
	p := strings.Trim(u.Path, "/")
	for _, seg := range strings.Split(p, "/") {
		if seg == "." || seg == ".." || (seg == "" && p != "") {
			return Target{}, fmt.Errorf("output target %q has an empty, . or .. path segment", s)
		}
	}
	if p != "" {
		p += "/"
	}
	if u.Scheme == "nfs" {
		if p == "" {
			return Target{}, fmt.Errorf("output target %q names no export", s)
		}
		return Target{Host: u.Host, Prefix: p}, nil
	}
	return Target{Bucket: u.Host, Prefix: p}, nil
}

func (t Target) String() string {
	if t.NFS() && t.Namespace != "" {
		return "nfs://" + t.Host + "/" + t.Prefix + " (in namespace " + t.Namespace + "'s directory of the export)"
	}
	if t.NFS() {
		return "nfs://" + t.Host + "/" + t.Prefix
	}
	return "s3://" + t.Bucket + "/" + t.Prefix
}

// NFS says whether the target is an NFS directory.
func (t Target) NFS() bool { return t.Host != "" }

// key is the object key of a volume path.
func (t Target) key(p string) string { return t.Prefix + p }

// Job is one volume's write-back.
type Job struct {
	// Volume names the job (its journal); one job per volume.
	Volume string `json:"volume"`
	// Upper is the overlay's upper directory of the volume, not written while the job runs.
	Upper  string `json:"upper"`
	Target Target `json:"target"`
	// Deletes deletes at the target the objects of the dataset paths the pods deleted.
	Deletes bool `json:"deletes,omitempty"`
	// Lower is the overlay's lower directory (the dataset version the volume was made on), read
	// for the bytes of dataset files and directories the pods renamed, and to tell which dataset
	// files a deleted or replaced directory held. It is not part of the recorded job: the caller
	// finds it again at each Run. Empty: renamed dataset files are not uploaded, a deleted path's
	// key and every key below it are deleted, and a replaced directory deletes nothing.
	Lower string `json:"-"`
}

// Config configures an Uploader.
type Config struct {
	// Dir holds the journals, one directory per volume, on storage that outlives the process.
	Dir string
	// Concurrency bounds the requests in flight, over all files of a job (default 16).
	Concurrency int
	// PartSize is a multipart upload's part size, and files this large or larger go in parts
	// (default 16 MiB; S3 allows 5 MiB to 5 GiB, and 10,000 parts: larger files get larger parts).
	PartSize int64
	// MinBackoff and MaxBackoff bound the wait between passes over a target that refused
	// (defaults 1 s and 5 min).
	MinBackoff, MaxBackoff time.Duration
	// NFSUID and NFSGID are the identity (AUTH_SYS) NFS targets are written as.
	NFSUID, NFSGID uint32
	// Settle is how long before a checkpoint a file must not have been written to be uploaded
	// by it (default 2 s): longer than the kernel's file time granularity, so that a write
	// during the upload always changes the file's mtime.
	Settle time.Duration
}

// Progress is what a job has done so far, reported after each pass and as files complete.
type Progress struct {
	Volume string
	// Files and Bytes are the job's changed files and their size; FilesDone and BytesDone what
	// of it is at the target.
	Files, FilesDone int
	Bytes, BytesDone int64
	// Sent is what this process sent (a resumed job does not send again what the target holds).
	Sent int64
	// Skipped counts entries that cannot be objects (symlinks, devices, sockets).
	Skipped int
	// Deferred counts the files a checkpoint left for the next one: written too recently, while
	// they were sent, or changed since the pass listed them (no longer the regular file it
	// planned to read: open.go).
	Deferred int
	// Deletes and DeletesDone count the paths to delete at the target, and those deleted.
	Deletes, DeletesDone int
	// Attempt counts passes; Err is the last one's failure, nil while it goes well, and RetryIn
	// the wait before the next pass after it.
	Attempt int
	Err     error
	RetryIn time.Duration
	Done    bool
}

// Uploader runs write-back jobs. It is safe for concurrent use by jobs of different volumes.
type Uploader struct {
	cfg Config
}

// New checks cfg and fills its defaults.
func New(cfg Config) (*Uploader, error) {
	if cfg.Dir == "" {
		return nil, errors.New("writeback: no journal directory")
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	if cfg.PartSize <= 0 {
		cfg.PartSize = 16 << 20
	}
	if cfg.PartSize < 5<<20 {
		return nil, fmt.Errorf("writeback: part size %d is below S3's 5 MiB", cfg.PartSize)
	}
	if cfg.Settle <= 0 {
		cfg.Settle = 2 * time.Second
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = time.Second
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(5*time.Minute, cfg.MinBackoff)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	return &Uploader{cfg: cfg}, nil
}

func (u *Uploader) journalDir(volume string) string {
	return filepath.Join(u.cfg.Dir, url.PathEscape(volume))
}

// Run uploads job's changes through client (built with the tenant's own credentials and
// endpoint policy; nil for an NFS target, written as Config.NFSUID) until every one is at the
// target, passing again after a refusal with a
// backoff that doubles up to MaxBackoff. It returns nil once the journal records the job
// complete, ctx's error when cancelled (the journal keeps what was done, and a later Run goes
// on from there), and an error at once only for a job that cannot start (no journal, no upper
// directory), or for a target that confirms neither a checksum nor an MD5 ETag (ErrUnconfirmed:
// a pass again would send everything again, to the same end). report, when set, is called from
// one goroutine at a time.
func (u *Uploader) Run(ctx context.Context, job Job, client *s3.Client, report func(Progress)) error {
	if _, err := os.Stat(job.Upper); err != nil {
		return fmt.Errorf("writeback of %s: %w", job.Volume, err)
	}
	j, err := openJournal(u.journalDir(job.Volume), job)
	if err != nil {
		return fmt.Errorf("writeback of %s: %w", job.Volume, err)
	}
	defer j.close()
	r := &run{cfg: u.cfg, job: job, client: client, j: j, report: report, slots: make(chan struct{}, u.cfg.Concurrency)}
	defer r.closePatient()
	r.p.Volume = job.Volume
	wait := u.cfg.MinBackoff
	for {
		if j.isComplete() {
			r.p.Done, r.p.Err = true, nil
			r.publish()
			return nil
		}
		r.p.Attempt++
		err := r.pass(ctx)
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		unconfirmed := errors.Is(err, ErrUnconfirmed)
		r.mu.Lock()
		r.p.Err, r.p.RetryIn = err, wait
		if unconfirmed {
			r.p.RetryIn = 0
		}
		r.mu.Unlock()
		r.publish()
		if unconfirmed {
			return fmt.Errorf("writeback of %s: %w", job.Volume, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, u.cfg.MaxBackoff)
	}
}

// Done reports whether volume's write-back holds nothing: every change at its target, or the
// job expired (Expire). A volume without a journal has none to do, nor has one still in use
// (checkpoints taken, not handed off) or kept between jobs (Keep).
func (u *Uploader) Done(volume string) (bool, error) {
	dir := u.journalDir(volume)
	if _, err := os.Stat(filepath.Join(dir, jobFile)); errors.Is(err, os.ErrNotExist) {
		return true, nil
	}
	st, err := scanLog(dir)
	return st.live || st.complete || st.kept || st.expired, err
}

// Recorded is the job volume's journal is of, when it has one.
func (u *Uploader) Recorded(volume string) (Job, bool) {
	job, err := readJob(u.journalDir(volume))
	return job, err == nil
}

// HandedOff is when volume's job was last handed off (Add); zero when it is not known (no
// journal, none yet, or a journal written before hand-offs carried their time).
func (u *Uploader) HandedOff(volume string) time.Time {
	st, err := scanLog(u.journalDir(volume))
	if err != nil || st.handedOff == 0 {
		return time.Time{}
	}
	return time.Unix(st.handedOff, 0)
}

// Expire ends volume's job that is not complete, pending past its age limit: it is no longer
// resumed (Jobs) nor holds the volume (Done); the journal keeps what is at the target, so that a
// later hand-off of the same job (a claim staged and let go again) sends only the rest.
func (u *Uploader) Expire(volume string) error {
	j, err := u.openJobJournal(volume)
	if j == nil || err != nil {
		return err
	}
	if err := j.append(record{Op: opExpired}, true); err != nil {
		_ = j.close()
		return err
	}
	return j.close()
}

// openJobJournal opens the journal of volume's recorded job; nil, nil when it has none.
func (u *Uploader) openJobJournal(volume string) (*journal, error) {
	dir := u.journalDir(volume)
	job, err := readJob(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return openJournal(dir, job)
}

// logState is what a journal's log says of its job, read without opening it for appending (a
// checkpoint may be appending): the volume still in use, the job complete, expired, or the
// journal kept between jobs of a volume that stays; and the last hand-off's time.
type logState struct {
	live, complete, kept, expired bool
	handedOff                     int64
}

func scanLog(dir string) (logState, error) {
	var st logState
	data, err := os.ReadFile(filepath.Join(dir, logFile))
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case line == `{"op":"complete"}`:
			st.complete, st.live = true, false
		case line == `{"op":"checkpoint"}`:
			st.live, st.kept, st.expired = !st.complete, false, false
		case strings.HasPrefix(line, `{"op":"handoff"`):
			st.live, st.kept, st.expired = false, false, false
			var r record
			if json.Unmarshal([]byte(line), &r) == nil {
				st.handedOff = r.At
			}
		case line == `{"op":"expired"}`:
			st.live, st.expired = false, true
		case line == `{"op":"kept"}`:
			st = logState{kept: true}
		}
	}
	return st, nil
}

// Pending returns the jobs whose journals are not complete, to run again after a restart.
func (u *Uploader) Pending() ([]Job, error) {
	entries, err := os.ReadDir(u.cfg.Dir)
	if err != nil {
		return nil, err
	}
	var out []Job
	for _, e := range entries {
		job, err := readJob(filepath.Join(u.cfg.Dir, e.Name()))
		if err != nil {
			continue // a directory without job.json: a crash before the job was recorded
		}
		if done, err := u.Done(job.Volume); err == nil && !done {
			out = append(out, job)
		}
	}
	return out, nil
}

// Forget removes volume's journal, once the caller deleted the data it was for.
func (u *Uploader) Forget(volume string) error {
	return os.RemoveAll(u.journalDir(volume))
}

// Keep ends volume's complete job when the volume stays (a claim, staged again later), where
// Forget would end it with the volume: its journal keeps only which files' objects are at the
// target (its log rewritten to their records), so that the volume's next job sends none of them
// again unless changed since, or no longer at the target (checked first). A journal kept
// already, or none, is left as it is; one not complete is an error.
func (u *Uploader) Keep(volume string) error {
	j, err := u.openJobJournal(volume)
	if j == nil || err != nil {
		return err
	}
	defer j.close()
	switch {
	case j.kept:
		return nil
	case !j.complete:
		return fmt.Errorf("writeback of %s: not complete", volume)
	}
	return j.keep()
}

// Add records job durably, before the caller lets the volume go: a crash after it resumes the
// job (Jobs), a crash before it finds the volume still published. What checkpoints uploaded of
// the same volume (the same job) is not sent again.
func (u *Uploader) Add(job Job) error {
	j, err := openJournal(u.journalDir(job.Volume), job)
	if err != nil {
		return err
	}
	if j.complete {
		// The volume's last job, complete, was not kept yet (the plugin stopped before Keep):
		// this hand-off is of its next one, which would otherwise end at once, sending nothing.
		if err := j.keep(); err != nil {
			_ = j.close()
			return err
		}
	}
	if err := j.append(record{Op: opHandoff, At: time.Now().Unix()}, true); err != nil {
		_ = j.close()
		return err
	}
	return j.close()
}

// Jobs returns every recorded job, complete or not, but those of volumes still in use and those
// expired: the caller finishes each (a complete one only needs its data deleted and Forget).
func (u *Uploader) Jobs() ([]Job, error) {
	entries, err := os.ReadDir(u.cfg.Dir)
	if err != nil {
		return nil, err
	}
	var out []Job
	for _, e := range entries {
		dir := filepath.Join(u.cfg.Dir, e.Name())
		job, err := readJob(dir)
		if err != nil {
			continue
		}
		if st, err := scanLog(dir); err == nil && !st.live && !st.kept && !st.expired {
			out = append(out, job)
		}
	}
	return out, nil
}

// Checkpoint uploads, once, what job's volume changed since the last checkpoint while its pods
// still write it (docs/datasets.md, "Checkpoints"): a file is uploaded only when it was not
// written for Settle before the pass and is not written while it is sent; one being written is
// left for the next checkpoint or the final upload, and never shows torn at the target. It
// records no completion: the final upload (Add, then Run) sends only what is left. A failure
// ends the pass; the next checkpoint goes on from the journal.
func (u *Uploader) Checkpoint(ctx context.Context, job Job, client *s3.Client, report func(Progress)) error {
	if _, err := os.Stat(job.Upper); err != nil {
		return fmt.Errorf("checkpoint of %s: %w", job.Volume, err)
	}
	j, err := openJournal(u.journalDir(job.Volume), job)
	if err != nil {
		return fmt.Errorf("checkpoint of %s: %w", job.Volume, err)
	}
	defer j.close()
	if j.complete {
		return nil
	}
	if err := j.append(record{Op: opCheckpoint}, true); err != nil {
		return err
	}
	r := &run{cfg: u.cfg, job: job, client: client, j: j, report: report, live: true, slots: make(chan struct{}, u.cfg.Concurrency)}
	defer r.closePatient()
	r.p.Volume, r.p.Attempt = job.Volume, 1
	err = r.pass(ctx)
	if err != nil {
		r.mu.Lock()
		r.p.Err = err
		r.mu.Unlock()
	}
	r.publish()
	return err
}
