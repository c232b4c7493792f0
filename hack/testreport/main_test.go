package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Events as `go test -json` writes them for a package with a passing, a skipped and a failing
// test, and a package without tests.
const events = `{"Action":"start","Package":"example.com/a"}
{"Action":"run","Package":"example.com/a","Test":"TestOK"}
{"Action":"output","Package":"example.com/a","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"example.com/a","Test":"TestOK","Output":"--- PASS: TestOK (0.00s)\n"}
{"Action":"pass","Package":"example.com/a","Test":"TestOK"}
{"Action":"run","Package":"example.com/a","Test":"TestRoot"}
{"Action":"output","Package":"example.com/a","Test":"TestRoot","Output":"=== RUN   TestRoot\n"}
{"Action":"output","Package":"example.com/a","Test":"TestRoot","Output":"    a_test.go:9: needs root\n"}
{"Action":"output","Package":"example.com/a","Test":"TestRoot","Output":"--- SKIP: TestRoot (0.00s)\n"}
{"Action":"skip","Package":"example.com/a","Test":"TestRoot"}
{"Action":"run","Package":"example.com/a","Test":"TestBad"}
{"Action":"output","Package":"example.com/a","Test":"TestBad","Output":"=== RUN   TestBad\n"}
{"Action":"output","Package":"example.com/a","Test":"TestBad","Output":"    a_test.go:12: wrong\n"}
{"Action":"output","Package":"example.com/a","Test":"TestBad","Output":"--- FAIL: TestBad (0.00s)\n"}
{"Action":"fail","Package":"example.com/a","Test":"TestBad"}
{"Action":"output","Package":"example.com/a","Output":"FAIL\n"}
{"Action":"output","Package":"example.com/a","Output":"FAIL\texample.com/a\t0.01s\n"}
{"Action":"fail","Package":"example.com/a"}
{"Action":"start","Package":"example.com/b"}
{"Action":"output","Package":"example.com/b","Output":"?   \texample.com/b\t[no test files]\n"}
{"Action":"skip","Package":"example.com/b"}
`

func TestRenderQuiet(t *testing.T) {
	var out, sink bytes.Buffer
	in := "go: downloading example.com/x v1.0.0\n" + events
	if err := render(strings.NewReader(in), &out, &sink, false); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"go: downloading example.com/x v1.0.0\n",
		"a_test.go:9: needs root",
		"--- FAIL: TestBad",
		"FAIL\texample.com/a",
		"?   \texample.com/b\t[no test files]",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "TestOK") {
		t.Errorf("a passing test's log is printed without -v:\n%s", got)
	}
	if sink.String() != events {
		t.Errorf("the JSON kept differs from the input:\n%s", sink.String())
	}
}

func TestSummarize(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a.jsonl")
	// A second file whose test binary died mid-test: the test counts as failed.
	died := filepath.Join(dir, "b.jsonl")
	if err := os.WriteFile(file, []byte(events), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(died, []byte(`{"Action":"run","Package":"example.com/c","Test":"TestHang"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	failed, err := summarize(&out, []string{file, died})
	if err != nil {
		t.Fatal(err)
	}
	if !failed {
		t.Error("summary does not report the failure")
	}
	got := out.String()
	for _, want := range []string{
		"SKIP example.com/a TestRoot: a_test.go:9: needs root\n",
		"FAIL example.com/a TestBad\n",
		"FAIL example.com/c TestHang\n",
		"FAIL example.com/a\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	if !strings.HasSuffix(got, "\ntests: 1 passed, 2 failed, 1 skipped\n") {
		t.Errorf("summary does not end with the totals:\n%s", got)
	}
}

// TestGate holds a target's run to its expected tests and skips: a listed test that did not run
// (a rename), one that skipped, and a skip nobody listed each fail it; a package the run did not
// report is not checked (another command of the target runs it).
func TestGate(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "run.jsonl")
	if err := os.WriteFile(run, []byte(events), 0o644); err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name, tests, skips string
		ok                 bool
		want               []string
	}{
		{"every expected test passed, the skip listed", "# c\nt ./a TestOK\nt ./c TestElsewhere\nu ./a TestGone\n", "t ./a TestRoot needs root\n", true,
			[]string{"gate: t: 1 expected tests of 2 packages checked, 0 problems"}},
		{"a renamed test", "t ./a TestOK\nt ./a TestRenamed\n", "* ./a TestR* needs root\n", false,
			[]string{"example.com/a TestRenamed did not run", "expected-tests.txt:2"}},
		{"an expected test skipped", "t ./a TestRoot\n", "t ./a TestRoot needs root\n", false,
			[]string{"example.com/a TestRoot skipped (a_test.go:9: needs root) but must pass"}},
		{"a new skip", "t ./a TestOK\n", "t ./a TestOther reason\n", false,
			[]string{"example.com/a TestRoot skipped (a_test.go:9: needs root): a skip not in expected-skips.txt"}},
		{"a failed test", "t ./a TestBad\n", "t ./a TestRoot needs root\n", false,
			[]string{"example.com/a TestBad did not pass"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := gateConfig{target: "t", module: "example.com", tests: write("tests.txt", tc.tests), skips: write("skips.txt", tc.skips)}
			var out bytes.Buffer
			ok, err := gate(&out, cfg, []string{run})
			if err != nil {
				t.Fatal(err)
			}
			if ok != tc.ok {
				t.Errorf("gate passed = %v, want %v:\n%s", ok, tc.ok, out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
	t.Run("a skip without a reason is refused", func(t *testing.T) {
		cfg := gateConfig{target: "t", module: "example.com", tests: write("tests.txt", ""), skips: write("skips.txt", "t ./a TestRoot\n")}
		if _, err := gate(io.Discard, cfg, []string{run}); err == nil {
			t.Error("an expected-skips line without a reason was accepted")
		}
	})
}

// TestWriteExpected lists the tests that passed, module-relative, for the target.
func TestWriteExpected(t *testing.T) {
	run := filepath.Join(t.TempDir(), "run.jsonl")
	if err := os.WriteFile(run, []byte(events), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := writeExpected(&out, "t", "example.com", []string{run}); err != nil {
		t.Fatal(err)
	}
	if out.String() != "t ./a TestOK\n" {
		t.Errorf("expected lines:\n%s", out.String())
	}
}
