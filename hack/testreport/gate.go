package main

// The gate holds each make target to the tests it must pass and the skips it may have, so that a
// suite cannot pass empty: a `-run` pattern that a rename makes match nothing, a subtest that is
// no longer reached, or a new t.Skip each fail the target instead of shrinking its count quietly.
//
//	hack/make/expected-tests.txt  target package test     (every test and subtest that must pass)
//	hack/make/expected-skips.txt  target package test reason (every skip allowed, with its reason)
//
// Packages are written relative to the module (./pkg/driver); a test name ending in '*' matches
// every test with that prefix (the csi-sanity specs that skip themselves, held to their count by
// test/specgate). A target is checked only on the packages its run reported, so a target of two
// `go test` commands is checked after each; a package left out of every command is what
// run-tests.sh's package check finds.

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// expectation is one line of an expectation file.
type expectation struct {
	target, pkg, test, reason string
	line                      int
}

// matches reports whether e names test t of package pkg.
func (e expectation) matches(pkg, t string) bool {
	if e.pkg != pkg {
		return false
	}
	if prefix, ok := strings.CutSuffix(e.test, "*"); ok {
		return strings.HasPrefix(t, prefix)
	}
	return e.test == t
}

// readExpectations parses an expectation file; module replaces a package's leading ".".
func readExpectations(name, module string, withReason bool) ([]expectation, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []expectation
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 3 || (withReason && len(fields) < 4) || (!withReason && len(fields) > 3) {
			return nil, fmt.Errorf("%s:%d: want %q", name, n, map[bool]string{true: "target package test reason", false: "target package test"}[withReason])
		}
		e := expectation{target: fields[0], pkg: fields[1], test: fields[2], line: n}
		if strings.HasPrefix(e.pkg, ".") {
			e.pkg = module + strings.TrimPrefix(e.pkg, ".")
		}
		if withReason {
			e.reason = strings.Join(fields[3:], " ")
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// gateConfig names the files the gate reads.
type gateConfig struct {
	target, tests, skips, module string
}

// gate checks the events of one target's run against the expectation files and reports whether
// the run passed the gate.
func gate(w io.Writer, cfg gateConfig, files []string) (bool, error) {
	results, _, err := readResults(files)
	if err != nil {
		return false, err
	}
	tests, err := readExpectations(cfg.tests, cfg.module, false)
	if err != nil {
		return false, err
	}
	skips, err := readExpectations(cfg.skips, cfg.module, true)
	if err != nil {
		return false, err
	}
	ran := map[string]bool{}
	for key := range results {
		ran[key[0]] = true
	}
	var problems []string
	checked := 0
	for _, e := range tests {
		if e.target != cfg.target || !ran[e.pkg] {
			continue
		}
		checked++
		if r := results[[2]string{e.pkg, e.test}]; r == nil {
			problems = append(problems, fmt.Sprintf("%s %s did not run (renamed, removed, or not matched by the target's -run); expected-tests.txt:%d", e.pkg, e.test, e.line))
		} else if r.action == "skip" {
			problems = append(problems, fmt.Sprintf("%s %s skipped (%s) but must pass; expected-tests.txt:%d", e.pkg, e.test, skipReason(r.output), e.line))
		} else if r.action != "pass" {
			problems = append(problems, fmt.Sprintf("%s %s did not pass; expected-tests.txt:%d", e.pkg, e.test, e.line))
		}
	}
	for key, r := range results {
		if key[1] == "" || r.action != "skip" || allowed(skips, cfg.target, key[0], key[1]) {
			continue
		}
		problems = append(problems, fmt.Sprintf("%s %s skipped (%s): a skip not in expected-skips.txt", key[0], key[1], skipReason(r.output)))
	}
	sort.Strings(problems)
	for _, p := range problems {
		fmt.Fprintf(w, "gate: %s: %s\n", cfg.target, p)
	}
	fmt.Fprintf(w, "gate: %s: %d expected tests of %d packages checked, %d problems\n", cfg.target, checked, len(ran), len(problems))
	return len(problems) == 0, nil
}

// allowed reports whether a skip of test t in pkg under target is listed.
func allowed(skips []expectation, target, pkg, t string) bool {
	for _, s := range skips {
		if (s.target == target || s.target == "*") && s.matches(pkg, t) {
			return true
		}
	}
	return false
}

// writeExpected prints the expected-tests lines of target: every test and subtest that passed in
// files, packages relative to module, sorted.
func writeExpected(w io.Writer, target, module string, files []string) error {
	results, _, err := readResults(files)
	if err != nil {
		return err
	}
	var lines []string
	for key, r := range results {
		if key[1] == "" || r.action != "pass" {
			continue
		}
		pkg := key[0]
		if rel, ok := strings.CutPrefix(pkg, module); ok {
			pkg = "." + rel
		}
		lines = append(lines, fmt.Sprintf("%s %s %s", target, pkg, key[1]))
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
	return nil
}
