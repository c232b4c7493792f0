// Command testreport shows `go test -json` as go test would show it and keeps the events, so that
// `make test` can list at its end every test that failed or skipped, across all of its targets.
//
//	go test -json ./pkg/... | testreport -out _output/test-results/test-driver.jsonl [-v]
//	testreport -summary _output/test-results/*.jsonl
//	testreport -gate -target test-driver -tests expected-tests.txt -skips expected-skips.txt run.jsonl
//	testreport -expected -target test-driver _output/test-results/test-driver.jsonl
//
// Without -v it prints what plain `go test` prints: a line per package, and the output of
// failing tests and packages; it also prints each skipped test with its reason. With -v it prints
// everything, as `go test -v`. Lines that are not JSON (go's own messages) pass through.
//
// The summary ends with the line "tests: N passed, N failed, N skipped".
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string // build-output, build-fail
}

func main() {
	out := flag.String("out", "", "Append the JSON events to this file.")
	verbose := flag.Bool("v", false, "Print every line of output, as go test -v.")
	summary := flag.Bool("summary", false, "Summarise the JSON files given as arguments instead of reading standard input.")
	gated := flag.Bool("gate", false, "Check the JSON files given as arguments against -tests and -skips for -target (gate.go).")
	expected := flag.Bool("expected", false, "Print the expected-tests lines of -target: every test that passed in the JSON files given.")
	var cfg gateConfig
	flag.StringVar(&cfg.target, "target", "", "The make target the JSON files are of (-gate, -expected).")
	flag.StringVar(&cfg.tests, "tests", "hack/make/expected-tests.txt", "The tests each target must pass (-gate).")
	flag.StringVar(&cfg.skips, "skips", "hack/make/expected-skips.txt", "The skips each target may have, with their reasons (-gate).")
	flag.StringVar(&cfg.module, "module", "github.com/cistern-csi/cistern", "The module that a package's leading '.' stands for.")
	flag.Parse()
	if *gated || *expected {
		ok, err := true, error(nil)
		if *gated {
			ok, err = gate(os.Stdout, cfg, flag.Args())
		} else {
			err = writeExpected(os.Stdout, cfg.target, cfg.module, flag.Args())
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "testreport:", err)
			os.Exit(2)
		}
		if !ok {
			os.Exit(1)
		}
		return
	}
	if *summary {
		failed, err := summarize(os.Stdout, flag.Args())
		if err != nil {
			fmt.Fprintln(os.Stderr, "testreport:", err)
			os.Exit(2)
		}
		if failed {
			os.Exit(1)
		}
		return
	}
	var sink io.Writer = io.Discard
	if *out != "" {
		if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "testreport:", err)
			os.Exit(2)
		}
		f, err := os.OpenFile(*out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testreport:", err)
			os.Exit(2)
		}
		defer f.Close()
		sink = f
	}
	if err := render(os.Stdin, os.Stdout, sink, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
}

// render reads events from r, writes the raw JSON lines to sink and the readable output to w.
func render(r io.Reader, w, sink io.Writer, verbose bool) error {
	// Output of each test (and, under "", of each package) until we know whether it passed.
	held := map[[2]string][]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		var ev event
		if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &ev) != nil {
			fmt.Fprintln(w, line)
			continue
		}
		fmt.Fprintln(sink, line)
		if verbose {
			if ev.Action == "output" || ev.Action == "build-output" {
				fmt.Fprint(w, ev.Output)
			}
			continue
		}
		key := [2]string{ev.Package, ev.Test}
		switch ev.Action {
		case "build-output":
			fmt.Fprint(w, ev.Output)
		case "output":
			held[key] = append(held[key], ev.Output)
		case "fail", "skip":
			if ev.Test == "" && ev.Action == "skip" {
				// A package without tests: go test's "?   pkg [no test files]" line.
				printTail(w, held[key])
			} else {
				fmt.Fprint(w, strings.Join(held[key], ""))
			}
			delete(held, key)
		case "pass":
			if ev.Test == "" {
				printTail(w, held[key])
			}
			delete(held, key)
		}
	}
	return sc.Err()
}

// printTail prints a passing package's summary line ("ok  pkg 1.2s"), not its test log.
func printTail(w io.Writer, lines []string) {
	for _, l := range lines {
		if strings.HasPrefix(l, "ok ") || strings.HasPrefix(l, "?  ") {
			fmt.Fprint(w, l)
		}
	}
}

type result struct {
	pkg, test, action string
	output            []string
}

// readResults reads the events of files: each test's (and, under "", each package's) result and
// output, in the order first seen, and the import paths whose build failed.
func readResults(files []string) (map[[2]string]*result, [][2]string, error) {
	results := map[[2]string]*result{}
	var order [][2]string
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var ev event
			if json.Unmarshal(sc.Bytes(), &ev) != nil {
				continue
			}
			if ev.Action == "build-fail" {
				ev.Package, ev.Test = ev.ImportPath, buildFailed
			}
			key := [2]string{ev.Package, ev.Test}
			r := results[key]
			if r == nil {
				r = &result{pkg: ev.Package, test: ev.Test}
				results[key] = r
				order = append(order, key)
			}
			switch ev.Action {
			case "output":
				r.output = append(r.output, ev.Output)
			case "pass", "fail", "skip", "build-fail":
				r.action = ev.Action
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return results, order, nil
}

// buildFailed is the test name under which readResults keeps a package whose build failed.
const buildFailed = "(build failed)"

// summarize lists the skipped and failed tests of the given files and the totals; it reports
// whether anything failed.
func summarize(w io.Writer, files []string) (bool, error) {
	results, order, err := readResults(files)
	if err != nil {
		return false, err
	}
	var passed, failed, skipped []*result
	var failedPkgs []string
	for _, key := range order {
		r := results[key]
		switch {
		case r.action == "build-fail":
			failedPkgs = append(failedPkgs, r.pkg+" (build failed)")
		case r.test == "" && r.action == "fail":
			failedPkgs = append(failedPkgs, r.pkg)
		case r.test == "":
		case r.action == "pass":
			passed = append(passed, r)
		case r.action == "fail":
			failed = append(failed, r)
		case r.action == "skip":
			skipped = append(skipped, r)
		default:
			// Started, never ended: the binary died (timeout, panic, killed).
			r.action = "fail"
			failed = append(failed, r)
		}
	}
	sort.Strings(failedPkgs)

	if len(skipped) > 0 {
		fmt.Fprintf(w, "\nSkipped tests (%d):\n", len(skipped))
		for _, r := range skipped {
			fmt.Fprintf(w, "  SKIP %s %s: %s\n", r.pkg, r.test, skipReason(r.output))
		}
	}
	if len(failed) > 0 {
		fmt.Fprintf(w, "\nFailed tests (%d):\n", len(failed))
		for _, r := range failed {
			fmt.Fprintf(w, "  FAIL %s %s\n", r.pkg, r.test)
		}
	}
	if len(failedPkgs) > 0 {
		fmt.Fprintf(w, "\nFailed packages (%d):\n", len(failedPkgs))
		for _, p := range failedPkgs {
			fmt.Fprintf(w, "  FAIL %s\n", p)
		}
	}
	fmt.Fprintf(w, "tests: %d passed, %d failed, %d skipped\n", len(passed), len(failed), len(skipped))
	return len(failed) > 0 || len(failedPkgs) > 0, nil
}

// skipReason is what the test logged, without go test's own "=== RUN" and "--- SKIP" lines.
func skipReason(output []string) string {
	var lines []string
	for _, l := range output {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		lines = append(lines, t)
	}
	if len(lines) == 0 {
		return "(no reason given)"
	}
	return strings.Join(lines, " / ")
}
