package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The statements a code cell may hold, one per line; blank lines and lines starting with # are
// skipped. Relative paths are relative to the working directory (the pod sets it to the
// notebook's directory in the clone).
//
//	print TEXT        TEXT to the cell's stdout
//	date TEXT         TEXT followed by the current time (RFC 3339, nanoseconds), as a notebook
//	                  that logs timestamps prints them
//	cat PATH          the file's content to stdout
//	ls DIR            the entries of DIR, sorted, directories with a trailing /
//	sha256 DIR        "<sha256>  <path relative to DIR>" for every regular file below DIR
//	                  (lost+found left out), in lexical order of the paths
//	df PATH           "df PATH total=<bytes> free=<bytes>" of the filesystem holding PATH
//	sleep DURATION    waits (Go duration syntax, e.g. 10s)
//	fail MESSAGE      fails the cell with MESSAGE
//
// A statement ending in "> PATH" writes its output to the file PATH instead, as a shell would,
// e.g. to leave results on a volume. Any other line fails the cell: a real notebook (Python)
// never passes by accident.
func runStatements(source string, stdout io.Writer) error {
	for line := range strings.Lines(source) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := runLine(line, stdout); err != nil {
			return err
		}
	}
	return nil
}

func runLine(line string, stdout io.Writer) error {
	stmt, target, redirected := cutLast(line, " > ")
	if !redirected {
		return runStatement(stmt, stdout)
	}
	target = strings.TrimSpace(target)
	f, err := os.Create(target)
	if err != nil {
		return statementError{line: line, err: err}
	}
	err = runStatement(strings.TrimSpace(stmt), f)
	if cerr := f.Close(); err == nil && cerr != nil {
		return statementError{line: line, err: cerr}
	}
	return err
}

func cutLast(s, sep string) (before, after string, found bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// failure is the error of a `fail` statement; statementError of any other failing statement.
type failure struct{ msg string }

func (f failure) Error() string { return f.msg }

type statementError struct {
	line string
	err  error
}

func (e statementError) Error() string { return fmt.Sprintf("%s: %v", e.line, e.err) }

// errorName is the exception name the output notebook and the error message give.
func errorName(err error) string {
	if errors.As(err, new(failure)) {
		return "NotebookFailure"
	}
	return "StatementError"
}

func runStatement(stmt string, stdout io.Writer) error {
	verb, arg, _ := strings.Cut(stmt, " ")
	arg = strings.TrimSpace(arg)
	var err error
	switch verb {
	case "print":
		_, err = fmt.Fprintln(stdout, arg)
	case "date":
		_, err = fmt.Fprintln(stdout, strings.TrimSpace(arg+" "+time.Now().UTC().Format(time.RFC3339Nano)))
	case "cat":
		var data []byte
		if data, err = os.ReadFile(arg); err == nil {
			_, err = stdout.Write(data)
		}
	case "ls":
		err = list(arg, stdout)
	case "sha256":
		err = hashTree(arg, stdout)
	case "df":
		var st unix.Statfs_t
		if err = unix.Statfs(arg, &st); err == nil {
			_, err = fmt.Fprintf(stdout, "df %s total=%d free=%d\n", arg, st.Blocks*uint64(st.Bsize), st.Bavail*uint64(st.Bsize))
		}
	case "sleep":
		var d time.Duration
		if d, err = time.ParseDuration(arg); err == nil {
			time.Sleep(d)
		}
	case "fail":
		return failure{arg}
	default:
		err = errors.New("not a statement of the papermill stand-in")
	}
	if err != nil {
		return statementError{line: strings.TrimSpace(verb + " " + arg), err: err}
	}
	return nil
}

func list(dir string, w io.Writer) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries { // sorted by name
		name := e.Name()
		if e.IsDir() {
			name += "/"
		}
		if _, err := fmt.Fprintln(w, name); err != nil {
			return err
		}
	}
	return nil
}

func hashTree(dir string, w io.Writer) error {
	var lines []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "lost+found" { // a filesystem's, not the data's
			return filepath.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		sum, err := hashFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		lines = append(lines, sum+"  "+filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return err
	}
	for _, l := range lines {
		if _, err := fmt.Fprintln(w, l); err != nil {
			return err
		}
	}
	return nil
}

func hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
