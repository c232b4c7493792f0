package compare

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func nb(t *testing.T, cells ...map[string]any) *Notebook {
	t.Helper()
	b, err := json.Marshal(map[string]any{"cells": cells, "nbformat": 4})
	if err != nil {
		t.Fatal(err)
	}
	n, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func code(outputs ...map[string]any) map[string]any {
	if outputs == nil {
		outputs = []map[string]any{}
	}
	return map[string]any{"cell_type": "code", "source": []string{"x = 1\n", "print(x)"}, "outputs": outputs, "execution_count": 1}
}

func markdown() map[string]any { return map[string]any{"cell_type": "markdown", "source": "# title"} }

func stream(text ...string) map[string]any {
	return map[string]any{"output_type": "stream", "name": "stdout", "text": text}
}

func result(plain string) map[string]any {
	return map[string]any{"output_type": "execute_result", "execution_count": 2, "data": map[string]any{"text/plain": plain, "image/png": "iVBOR"}}
}

func TestCompare(t *testing.T) {
	for _, tc := range []struct {
		name        string
		golden, got *Notebook
		tol         float64
		want        string // "" match; else the mismatch text
	}{
		{name: "identical", golden: nb(t, markdown(), code(stream("a\n", "b\n"))), got: nb(t, markdown(), code(stream("a\nb\n")))},
		{name: "numbers within tolerance", tol: 1e-3,
			golden: nb(t, code(stream("accuracy 0.9120 loss 12.5\n")), code(result("array([1.0, 2.0])"))),
			got:    nb(t, code(stream("accuracy 0.9125 loss 12.51\n")), code(result("array([1.0004, 2.0])")))},
		{name: "failure case - number out of tolerance names the first differing cell", tol: 1e-3,
			golden: nb(t, markdown(), code(stream("ok\n")), code(stream("accuracy 0.91\n"))),
			got:    nb(t, markdown(), code(stream("ok\n")), code(stream("accuracy 0.85\n"))),
			want:   `cell 2: stream stdout differs: got "accuracy 0.85\n", golden "accuracy 0.91\n" (numeric tolerance 0.001)`},
		{name: "failure case - exact by default", golden: nb(t, code(result("0.5"))), got: nb(t, code(result("0.50001"))),
			want: `cell 0: execute_result differs: got "0.50001", golden "0.5"`},
		{name: "failure case - text around numbers differs", tol: 1, golden: nb(t, code(stream("loss 1\n"))), got: nb(t, code(stream("gain 1\n"))),
			want: "cell 0: stream stdout differs"},
		{name: "failure case - an error instead of a result",
			golden: nb(t, code(result("42"))),
			got:    nb(t, code(map[string]any{"output_type": "error", "ename": "ValueError", "evalue": "bad", "traceback": []string{}})),
			want:   "cell 0: output 0 is error, the golden notebook has execute_result"},
		{name: "failure case - missing output", golden: nb(t, code(stream("a\n"), result("1"))), got: nb(t, code(stream("a\n"))),
			want: "cell 0: 1 outputs, the golden notebook has 2"},
		{name: "failure case - fewer code cells", golden: nb(t, code(), code()), got: nb(t, code()),
			want: "1 code cells, the golden notebook has 2"},
		{name: "images and execution counts are not compared",
			golden: nb(t, code(map[string]any{"output_type": "display_data", "data": map[string]any{"image/png": "AAA"}}, result("1"))),
			got:    nb(t, code(map[string]any{"output_type": "display_data", "data": map[string]any{"image/png": "BBB"}}, result("1")))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := Compare(tc.golden, tc.got, Options{Tolerance: tc.tol})
			got := ""
			if m != nil {
				got = m.Error()
			}
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("mismatch %q, want %q", got, tc.want)
			}
		})
	}
}

// Volatile output — timestamps, durations, a stream of warnings — is left out by pattern and by
// type, as the notebook validator's comparison settings allow.
func TestCompareIgnoring(t *testing.T) {
	stamp := regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z?`)
	took := regexp.MustCompile(`took [0-9.]+s`)
	stderr := func(text string) map[string]any {
		return map[string]any{"output_type": "stream", "name": "stderr", "text": text}
	}
	golden := nb(t, code(stream("started 2024-01-02T03:04:05Z\n", "loss 0.25 took 1.5s\n"), stderr("warning: slow\n"), result("42")))
	got := nb(t, code(stream("started 2026-11-26T16:40:01.123Z\n", "loss 0.25 took 73.02s\n"), result("42")))
	for _, tc := range []struct {
		name string
		opt  Options
		want string
	}{
		{name: "timestamps, durations and stderr ignored", opt: Options{IgnoreTypes: []string{"stderr"}, IgnorePatterns: []*regexp.Regexp{stamp, took}}},
		{name: "failure case - stderr still compared", opt: Options{IgnorePatterns: []*regexp.Regexp{stamp, took}},
			want: "cell 0: output 1 is execute_result, the golden notebook has stream stderr"},
		{name: "failure case - the timestamp compared", opt: Options{IgnoreTypes: []string{"stderr"}, IgnorePatterns: []*regexp.Regexp{took}},
			want: "cell 0: stream stdout differs"},
		{name: "every stream ignored",
			opt: Options{IgnoreTypes: []string{"stream"}}, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := Compare(golden, got, tc.opt)
			have := ""
			if m != nil {
				have = m.Error()
			}
			if tc.want == "" && have != "" || tc.want != "" && !strings.Contains(have, tc.want) {
				t.Errorf("mismatch %q, want %q", have, tc.want)
			}
		})
	}
	// The loss is still compared with the pattern in place.
	worse := nb(t, code(stream("started 2026-11-26T16:40:01Z\n", "loss 0.75 took 2s\n"), result("42")))
	if m := Compare(golden, worse, Options{IgnoreTypes: []string{"stderr"}, IgnorePatterns: []*regexp.Regexp{stamp, took}}); m == nil {
		t.Error("a different loss matched")
	}
}

func TestTextMatches(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		tol  float64
		want bool
	}{
		{"x=1e-3", "x=0.001", 0, true},
		{"x=1000", "x=1001", 1e-3, true},  // relative above 1
		{"x=1000", "x=1002", 1e-3, false}, // 2 > 1e-3*1002
		{"x=0.0001", "x=0.0009", 1e-3, true},
		{"-5", "+5", 1, false},
		{"1 2", "1", 1, false},
	} {
		if got := TextMatches(tc.a, tc.b, tc.tol); got != tc.want {
			t.Errorf("TextMatches(%q, %q, %g) = %v, want %v", tc.a, tc.b, tc.tol, got, tc.want)
		}
	}
}

func TestCommand(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, n map[string]any) string {
		b, _ := json.Marshal(n)
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	g := write("g.ipynb", map[string]any{"cells": []any{code(stream("0.5\n"))}})
	same := write("s.ipynb", map[string]any{"cells": []any{code(stream("0.5000001\n"))}})
	other := write("o.ipynb", map[string]any{"cells": []any{code(stream("0.7\n"))}})
	var out, errb bytes.Buffer
	if rc := Main([]string{"--golden", g, "--executed", same, "--tolerance", "1e-6"}, &out, &errb); rc != 0 {
		t.Errorf("rc %d: %s", rc, errb.String())
	}
	errb.Reset()
	if rc := Main([]string{"--golden", g, "--executed", other}, &out, &errb); rc != 1 || !strings.Contains(errb.String(), "cell 0: stream stdout differs") {
		t.Errorf("rc %d: %s", rc, errb.String())
	}
	if rc := Main([]string{"--golden", g, "--executed", filepath.Join(dir, "missing")}, &out, &errb); rc != 2 {
		t.Errorf("missing file: rc %d", rc)
	}
	if rc := Main([]string{"--golden", g, "--executed", same, "--tolerance", "-1"}, &out, &errb); rc != 2 {
		t.Errorf("negative tolerance: rc %d", rc)
	}
	stamped := write("t.ipynb", map[string]any{"cells": []any{code(stream("at 12:00:01 0.5\n"), map[string]any{"output_type": "stream", "name": "stderr", "text": "w"})}})
	stampedGolden := write("tg.ipynb", map[string]any{"cells": []any{code(stream("at 09:30:00 0.5\n"))}})
	if rc := Main([]string{"--golden", stampedGolden, "--executed", stamped, "--ignore-output-type", "stderr",
		"--ignore-pattern", `\d\d:\d\d:\d\d`}, &out, &errb); rc != 0 {
		t.Errorf("ignoring: rc %d: %s", rc, errb.String())
	}
	if rc := Main([]string{"--golden", g, "--executed", same, "--ignore-output-type", "html"}, &out, &errb); rc != 2 {
		t.Errorf("unknown output type: rc %d", rc)
	}
	if rc := Main([]string{"--golden", g, "--executed", same, "--ignore-pattern", "("}, &out, &errb); rc != 2 {
		t.Errorf("bad pattern: rc %d", rc)
	}
}

// Cells gives every code cell its result (index among all cells), compared with the golden
// notebook or, without one, failed only when it raised.
func TestCells(t *testing.T) {
	errOut := map[string]any{"output_type": "error", "ename": "ValueError", "evalue": "bad"}
	got := nb(t, markdown(), code(stream("0.5\n")), code(stream("0.7\n")), markdown(), code(errOut), code())
	golden := nb(t, code(stream("0.5\n")), code(stream("0.9\n")), code(errOut))
	r := Cells(golden, got, Options{})
	if len(r.Passed) != 2 || r.Passed[0] != 1 || r.Passed[1] != 4 || len(r.Failed) != 2 ||
		r.Failed[0].Cell != 2 || !strings.Contains(r.Failed[0].Reason, `stream stdout differs: got "0.7\n", golden "0.9\n"`) ||
		r.Failed[1].Cell != 5 || r.Failed[1].Reason != "the golden notebook has no code cell 4 (it has 3)" {
		t.Errorf("with golden: %+v", r)
	}
	r = Cells(nil, got, Options{})
	if len(r.Passed) != 3 || len(r.Failed) != 1 || r.Failed[0] != (FailedCell{Cell: 4, Reason: "raised ValueError: bad"}) {
		t.Errorf("without golden: %+v", r)
	}
}

// Encode stays within the budget: reasons shortened first, then cells counted as omitted.
func TestResultsEncode(t *testing.T) {
	r := Results{SHA256: strings.Repeat("0", 64)}
	for i := range 2000 {
		if i%10 == 0 {
			r.Failed = append(r.Failed, FailedCell{Cell: i, Reason: strings.Repeat("é", 500)})
		} else {
			r.Passed = append(r.Passed, i)
		}
	}
	line := r.Encode(ResultsBudget)
	if len(line) > ResultsBudget {
		t.Fatalf("%d bytes, budget %d", len(line), ResultsBudget)
	}
	human, back, ok := ParseResults("message\n" + line + "\n")
	if !ok || human != "message" || back.SHA256 != r.SHA256 || back.Omitted == 0 ||
		len(back.Passed)+len(back.Failed)+back.Omitted != 2000 {
		t.Errorf("parsed %q %v: %d passed, %d failed, %d omitted", human, ok, len(back.Passed), len(back.Failed), back.Omitted)
	}
	small := Results{Passed: []int{1}, Failed: []FailedCell{{Cell: 2, Reason: strings.Repeat("x", 300)}}}.Encode(ResultsBudget)
	if _, back, _ := ParseResults(small); len([]rune(back.Failed[0].Reason)) != ReasonMax {
		t.Errorf("reason of %d runes, want %d", len([]rune(back.Failed[0].Reason)), ReasonMax)
	}
	if _, _, ok := ParseResults("git: fatal"); ok {
		t.Error("a message without results parsed")
	}
}

// The command writes the message and the results, with the executed notebook's SHA-256, to the
// results file; without a golden notebook it only checks for errors.
func TestCommandResultsFile(t *testing.T) {
	dir := t.TempDir()
	executed := filepath.Join(dir, "e.ipynb")
	raw, _ := json.Marshal(map[string]any{"cells": []any{markdown(), code(stream("1\n")), code(map[string]any{"output_type": "error", "ename": "E", "evalue": "v"})}})
	if err := os.WriteFile(executed, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	results := filepath.Join(dir, "termination-log")
	var out, errb bytes.Buffer
	if rc := Main([]string{"--executed", executed, "--results-file", results}, &out, &errb); rc != 0 {
		t.Fatalf("rc %d: %s", rc, errb.String())
	}
	b, err := os.ReadFile(results)
	if err != nil {
		t.Fatal(err)
	}
	human, r, ok := ParseResults(string(b))
	sum := sha256.Sum256(raw)
	if !ok || human != "notebook ran: 2 code cells, 1 raised an error" || r.SHA256 != hex.EncodeToString(sum[:]) ||
		len(r.Passed) != 1 || r.Passed[0] != 1 || len(r.Failed) != 1 || r.Failed[0].Cell != 2 {
		t.Errorf("results %q: %q %+v", b, human, r)
	}
}
