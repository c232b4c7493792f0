package compare

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
)

// Command is the name of the workload-controller subcommand that runs Main.
const Command = "compare-notebook"

// Main compares the executed notebook with the golden one:
//
//	compare-notebook [--golden FILE] --executed FILE [--results-file FILE] [--tolerance T] [--ignore-output-type TYPE]... [--ignore-pattern REGEXP]...
//
// It exits 0 when they match, 1 with the first differing cell on stderr when they do not (the
// container's log tail becomes the job's message), 2 on bad arguments or unreadable notebooks.
// Without --golden it only reports the executed notebook's cells (those that raised an error
// fail) and exits 0. --results-file (the termination message) gets the message and the per-cell
// results line (ResultsPrefix) with the executed notebook's SHA-256.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(Command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	golden := fs.String("golden", "", "the golden notebook; without it only errors raised fail a cell")
	executed := fs.String("executed", "", "the executed notebook")
	resultsFile := fs.String("results-file", "", "where to write the message and the per-cell results (the termination message)")
	tolerance := fs.String("tolerance", "", "numeric tolerance (relative above 1, absolute below)")
	var opt Options
	fs.Func("ignore-output-type", "an output type to leave out: "+strings.Join(OutputTypes, ", ")+" (repeatable)", func(s string) error {
		if !slices.Contains(OutputTypes, s) {
			return fmt.Errorf("unknown output type %q", s)
		}
		opt.IgnoreTypes = append(opt.IgnoreTypes, s)
		return nil
	})
	fs.Func("ignore-pattern", "a regular expression whose matches are taken as equal (repeatable)", func(s string) error {
		re, err := regexp.Compile(s)
		if err != nil {
			return err
		}
		opt.IgnorePatterns = append(opt.IgnorePatterns, re)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return 2
	}
	tol, err := ParseTolerance(*tolerance)
	if err != nil || *executed == "" {
		fmt.Fprintf(stderr, "%s: want [--golden FILE] --executed FILE [--tolerance T]: %v\n", Command, err)
		return 2
	}
	opt.Tolerance = tol
	var g *Notebook
	if *golden != "" {
		if g, _, err = readNotebook(*golden); err != nil {
			fmt.Fprintf(stderr, "golden notebook %s: %v\n", *golden, err)
			return 2
		}
	}
	e, raw, err := readNotebook(*executed)
	if err != nil {
		fmt.Fprintf(stderr, "executed notebook %s: %v\n", *executed, err)
		return 2
	}
	results := Cells(g, e, opt)
	sum := sha256.Sum256(raw)
	results.SHA256 = hex.EncodeToString(sum[:])
	msg, code := verdict(g, e, opt, results), 0
	out := stdout
	if g != nil && Compare(g, e, opt) != nil {
		out, code = stderr, 1
	}
	fmt.Fprintln(out, msg)
	if *resultsFile != "" {
		report := clipRunes(msg, 800) + "\n" + results.Encode(ResultsBudget) + "\n"
		if err := os.WriteFile(*resultsFile, []byte(report), 0o644); err != nil {
			fmt.Fprintf(stderr, "writing the results to %s: %v\n", *resultsFile, err)
			return 2
		}
	}
	return code
}

// verdict is the message a person reads.
func verdict(g, e *Notebook, opt Options, r Results) string {
	if g == nil {
		return fmt.Sprintf("notebook ran: %d code cells, %d raised an error", len(r.Passed)+len(r.Failed), len(r.Failed))
	}
	if m := Compare(g, e, opt); m != nil {
		return fmt.Sprintf("output differs from the golden notebook: %v", m)
	}
	return fmt.Sprintf("outputs match the golden notebook (%d cells)", len(e.Cells))
}

func readNotebook(path string) (*Notebook, []byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	nb, err := Parse(b)
	return nb, b, err
}
