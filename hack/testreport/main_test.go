package main

import (
	"bytes"
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
