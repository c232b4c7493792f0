// Command checker is the test container of the node-level tests. It checks the volumes mounted
// into its container and writes what it saw as JSON to a results directory the test reads on
// the host (tests never use kubectl exec or logs). The image holds nothing but this static
// binary: no shell, no libc.
//
//	checker -dir /data -out /results/pod1 -write-read -fill -hash -read -heartbeat 1s
//
// writes /results/pod1.json once the checks ran, then (with -heartbeat) writes a file in each
// directory and reads it back every period, recording the outcome in /results/pod1.heartbeat.json,
// and keeps running until SIGTERM. Results are written atomically (temporary file, rename).
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Result is what one run saw, per directory.
type Result struct {
	UID    int         `json:"uid"`
	GID    int         `json:"gid"`
	Groups []int       `json:"groups"`
	Dirs   []DirResult `json:"dirs"`
}

// DirResult is what the checks saw in one directory.
type DirResult struct {
	Dir        string            `json:"dir"`
	TotalBytes uint64            `json:"totalBytes"`
	FreeBytes  uint64            `json:"freeBytes"`
	WriteRead  *Outcome          `json:"writeRead,omitempty"`
	Fill       *FillOutcome      `json:"fill,omitempty"`
	Files      map[string]string `json:"files,omitempty"` // relative path -> sha256
	HashError  string            `json:"hashError,omitempty"`
	Contents   map[string]string `json:"contents,omitempty"` // relative path -> content, small files
	ReadError  string            `json:"readError,omitempty"`
}

// Outcome of a check: OK or the error it met.
type Outcome struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// FillOutcome says how much could be written before the first error, and which error.
type FillOutcome struct {
	Bytes  int64  `json:"bytes"`
	Error  string `json:"error,omitempty"`
	ENOSPC bool   `json:"enospc"`
}

// Reads counts the reads of -read-loop so far.
type Reads struct {
	Rounds int64 `json:"rounds"` // complete passes over every file
	Reads  int64 `json:"reads"`  // whole files read
	Failed int64 `json:"failed"` // reads that ended in an error
	Differ int64 `json:"differ"` // reads whose sha256 differs from the file's first read
	Bytes  int64 `json:"bytes"`
	// Current is the file being read, "" between reads.
	Current string            `json:"current,omitempty"`
	Errors  []string          `json:"errors,omitempty"` // the first few
	First   map[string]string `json:"first"`            // relative path -> sha256 of its first read
}

// Heartbeat is the latest periodic write-and-read-back.
type Heartbeat struct {
	Seq   int64     `json:"seq"`
	Time  time.Time `json:"time"`
	OK    bool      `json:"ok"`
	Error string    `json:"error,omitempty"`
}

type dirList []string

func (d *dirList) String() string     { return strings.Join(*d, ",") }
func (d *dirList) Set(v string) error { *d = append(*d, v); return nil }

func main() {
	var dirs dirList
	flag.Var(&dirs, "dir", "Directory to check (repeatable).")
	out := flag.String("out", "", "Results path prefix: <out>.json and <out>.heartbeat.json.")
	writeRead := flag.Bool("write-read", false, "Write a file of -size bytes, read it back and compare.")
	size := flag.Int64("size", 1<<20, "Size of the -write-read file.")
	fill := flag.Bool("fill", false, "Write until the first error (expected: ENOSPC), then remove what was written.")
	fillMax := flag.Int64("fill-max", 8<<30, "Stop -fill after this many bytes.")
	hash := flag.Bool("hash", false, "Record the sha256 of every regular file.")
	read := flag.Bool("read", false, "Record the content of every regular file of up to 64 KiB, e.g. what a notebook left on a volume.")
	heartbeat := flag.Duration("heartbeat", 0, "Period of the write-and-read-back heartbeat; 0 disables it.")
	readLoop := flag.Bool("read-loop", false, "After the checks, read every regular file of each -dir whole, again and again, its page cache dropped first (so each read reaches the filesystem), comparing it with the file's first read; the counts go to <out>.reads.json before and after each file.")
	exit := flag.Bool("exit", false, "Exit after the checks instead of running until SIGTERM.")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "checker: -out is required")
		os.Exit(2)
	}

	res := Result{UID: os.Getuid(), GID: os.Getgid()}
	res.Groups, _ = os.Getgroups()
	for _, dir := range dirs {
		dr := DirResult{Dir: dir}
		if *writeRead {
			dr.WriteRead = checkWriteRead(dir, *size)
		}
		if *fill {
			dr.Fill = fillDir(dir, *fillMax)
		}
		if *hash {
			files, err := hashTree(dir)
			dr.Files = files
			if err != nil {
				dr.HashError = err.Error()
			}
		}
		if *read {
			contents, err := readTree(dir, 64<<10)
			dr.Contents = contents
			if err != nil {
				dr.ReadError = err.Error()
			}
		}
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err == nil {
			dr.TotalBytes = st.Blocks * uint64(st.Bsize)
			dr.FreeBytes = st.Bavail * uint64(st.Bsize)
		}
		res.Dirs = append(res.Dirs, dr)
	}
	if err := writeJSON(*out+".json", res); err != nil {
		fmt.Fprintln(os.Stderr, "checker:", err)
		os.Exit(1)
	}
	if *exit {
		return
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	if *readLoop {
		go readForever(dirs, *out+".reads.json")
	}
	var tick <-chan time.Time
	if *heartbeat > 0 {
		t := time.NewTicker(*heartbeat)
		defer t.Stop()
		tick = t.C
	}
	var seq int64
	for {
		select {
		case <-sigs:
			return
		case now := <-tick:
			seq++
			hb := Heartbeat{Seq: seq, Time: now, OK: true}
			for _, dir := range dirs {
				if o := checkWriteRead(dir, 4096); !o.OK {
					hb.OK, hb.Error = false, o.Error
					break
				}
			}
			if err := writeJSON(*out+".heartbeat.json", hb); err != nil {
				fmt.Fprintln(os.Stderr, "checker:", err)
			}
		}
	}
}

// checkWriteRead writes size bytes of a pattern through the page cache to disk and reads them back.
func checkWriteRead(dir string, size int64) *Outcome {
	path := filepath.Join(dir, ".checker-write-read")
	want := pattern(size)
	if err := writeSynced(path, want); err != nil {
		return &Outcome{Error: err.Error()}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		return &Outcome{Error: err.Error()}
	}
	if !bytes.Equal(got, want) {
		return &Outcome{Error: fmt.Sprintf("read back %d bytes that differ from the %d written", len(got), len(want))}
	}
	return &Outcome{OK: true}
}

func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	serr := f.Sync()
	cerr := f.Close()
	return errors.Join(werr, serr, cerr)
}

func pattern(n int64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/4096)
	}
	return b
}

// fillDir writes 1 MiB chunks, syncing each, until a write fails or max is reached.
func fillDir(dir string, max int64) *FillOutcome {
	path := filepath.Join(dir, ".checker-fill")
	defer os.Remove(path)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return outcomeOf(0, err)
	}
	defer f.Close()
	chunk := pattern(1 << 20)
	var written int64
	for written < max {
		n, err := f.Write(chunk)
		written += int64(n)
		if err == nil {
			err = f.Sync()
		}
		if err != nil {
			return outcomeOf(written, err)
		}
	}
	return &FillOutcome{Bytes: written}
}

func outcomeOf(n int64, err error) *FillOutcome {
	return &FillOutcome{Bytes: n, Error: err.Error(), ENOSPC: errors.Is(err, syscall.ENOSPC)}
}

// hashTree returns the sha256 of every regular file under dir.
func hashTree(dir string) (map[string]string, error) {
	files := map[string]string{}
	err := walkFiles(dir, func(path, rel string) error {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return err
		}
		files[rel] = hex.EncodeToString(h.Sum(nil))
		return nil
	})
	return files, err
}

// walkFiles calls fn for every regular file under dir with its path relative to dir, skipping
// lost+found and the checker's own files.
func walkFiles(dir string, fn func(path, rel string) error) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Name() == "lost+found" && d.IsDir() {
			return filepath.SkipDir
		}
		if !d.Type().IsRegular() || strings.HasPrefix(d.Name(), ".checker-") {
			return nil
		}
		rel, _ := filepath.Rel(dir, path)
		return fn(path, filepath.ToSlash(rel))
	})
}

// readTree returns the content of every regular file under dir of at most max bytes.
func readTree(dir string, max int64) (map[string]string, error) {
	contents := map[string]string{}
	err := walkFiles(dir, func(path, rel string) error {
		info, err := os.Stat(path)
		if err != nil || info.Size() > max {
			return err
		}
		data, err := os.ReadFile(path)
		contents[rel] = string(data)
		return err
	})
	return contents, err
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// readForever reads every regular file of dirs whole, in a loop, and records the counts in out
// before and after each file: a test reads the file to know how many reads succeeded, and which
// file is being read.
func readForever(dirs []string, out string) {
	var files []string
	for _, dir := range dirs {
		_ = walkFiles(dir, func(path, _ string) error { files = append(files, path); return nil })
	}
	r := Reads{First: map[string]string{}}
	record := func() {
		if err := writeJSON(out, r); err != nil {
			fmt.Fprintln(os.Stderr, "checker:", err)
		}
	}
	for {
		for _, path := range files {
			r.Current = path
			record()
			sum, n, err := readDropped(path)
			r.Current = ""
			r.Bytes += n
			switch first, seen := r.First[path]; {
			case err != nil:
				r.Failed++
				if len(r.Errors) < 10 {
					r.Errors = append(r.Errors, err.Error())
				}
			case !seen:
				r.First[path] = sum
				r.Reads++
			case sum != first:
				r.Differ++
				r.Reads++
			default:
				r.Reads++
			}
			record()
		}
		r.Rounds++
	}
}

// readDropped drops path's page cache, then reads it whole and returns its sha256.
func readDropped(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	// POSIX_FADV_DONTNEED (4): the kernel forgets the file's cached pages.
	_, _, _ = syscall.Syscall6(syscall.SYS_FADVISE64, f.Fd(), 0, 0, 4, 0, 0)
	h := sha256.New()
	n, err := io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil)), n, err
}
