// Package compare checks an executed notebook against a golden one, cell by cell, as the notebook
// validator does: the code cells must match in number, and each one's outputs in kind and text,
// numbers within a tolerance. It runs in the validation pod (workload-controller
// compare-notebook) after papermill, so the controller never reads notebook contents.
package compare

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Notebook is the part of an nbformat 4 notebook the comparison reads.
type Notebook struct {
	Cells []Cell `json:"cells"`
}

// Cell is one notebook cell.
type Cell struct {
	CellType string   `json:"cell_type"`
	Source   Text     `json:"source"`
	Outputs  []Output `json:"outputs"`
}

// Output is one output of a code cell.
type Output struct {
	OutputType string          `json:"output_type"`
	Name       string          `json:"name"` // stream: stdout or stderr
	Text       Text            `json:"text"` // stream
	Data       map[string]Text `json:"data"` // execute_result, display_data
	EName      string          `json:"ename"`
	EValue     string          `json:"evalue"`
}

// Text is nbformat's multiline string: a string or a list of strings to join.
type Text string

// UnmarshalJSON accepts both forms.
func (t *Text) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*t = Text(s)
		return nil
	}
	var parts []string
	if err := json.Unmarshal(b, &parts); err != nil {
		// Rich outputs (JSON data, images as objects) are not text: nothing to compare.
		*t = ""
		return nil
	}
	*t = Text(strings.Join(parts, ""))
	return nil
}

// Parse reads a notebook.
func Parse(b []byte) (*Notebook, error) {
	var nb Notebook
	if err := json.Unmarshal(b, &nb); err != nil {
		return nil, fmt.Errorf("not a notebook: %w", err)
	}
	return &nb, nil
}

// ParseTolerance reads a numeric tolerance; empty is 0 (exact).
func ParseTolerance(s string) (float64, error) {
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("numeric tolerance %q: want a non-negative decimal number", s)
	}
	return v, nil
}

// Mismatch describes the first difference found.
type Mismatch struct {
	// Cell is the index of the cell among all cells (as Jupyter shows it, from 0); -1 when the
	// notebooks differ in their number of code cells.
	Cell int
	// What says what differs.
	What string
}

func (m *Mismatch) Error() string {
	if m.Cell < 0 {
		return m.What
	}
	return fmt.Sprintf("cell %d: %s", m.Cell, m.What)
}

// Options say how loosely outputs are compared.
type Options struct {
	// Tolerance is how far numbers may be apart: |a-b| <= Tolerance * max(1, |a|, |b|).
	Tolerance float64
	// IgnoreTypes are output types left out of the comparison: an output_type (stream,
	// execute_result, display_data, error) or a stream's name (stdout, stderr).
	IgnoreTypes []string
	// IgnorePatterns match text taken as equal wherever it is (timestamps, durations, ids).
	IgnorePatterns []*regexp.Regexp
}

// OutputTypes are the values IgnoreTypes may hold.
var OutputTypes = []string{"stream", "stdout", "stderr", "execute_result", "display_data", "error"}

// ignored stands for every match of an ignore pattern; it holds no digit, so numbers in it are
// not compared either.
const ignored = "\x00ignored\x00"

// Compare compares the code cells of got with golden's, in order, and returns the first mismatch
// (nil when they match). Execution counts, metadata and images are not compared; stream, result
// and error outputs are (less those opt leaves out), text for text with numbers within the
// tolerance and the matches of the ignore patterns taken as equal.
func Compare(golden, got *Notebook, opt Options) *Mismatch {
	gc, oc := codeCells(golden), codeCells(got)
	for i := 0; i < min(len(gc), len(oc)); i++ {
		if what := compareOutputs(golden.Cells[gc[i]].Outputs, got.Cells[oc[i]].Outputs, opt); what != "" {
			return &Mismatch{Cell: oc[i], What: what}
		}
	}
	if len(gc) != len(oc) {
		return &Mismatch{Cell: -1, What: fmt.Sprintf("%d code cells, the golden notebook has %d", len(oc), len(gc))}
	}
	return nil
}

func codeCells(nb *Notebook) []int {
	var out []int
	for i, c := range nb.Cells {
		if c.CellType == "code" {
			out = append(out, i)
		}
	}
	return out
}

// compared are the outputs a comparison looks at; display_data of images and widgets are left out,
// and so are the types ignore names.
func compared(outs []Output, ignore []string) []Output {
	var keep []Output
	for _, o := range outs {
		if slices.Contains(ignore, o.OutputType) || o.OutputType == "stream" && slices.Contains(ignore, o.Name) {
			continue
		}
		switch o.OutputType {
		case "stream", "error":
			keep = append(keep, o)
		case "execute_result", "display_data":
			if _, ok := o.Data["text/plain"]; ok {
				keep = append(keep, o)
			}
		}
	}
	return keep
}

func compareOutputs(golden, got []Output, opt Options) string {
	g, o := compared(golden, opt.IgnoreTypes), compared(got, opt.IgnoreTypes)
	for i := 0; i < min(len(g), len(o)); i++ {
		want, have := g[i], o[i]
		if want.OutputType != have.OutputType || want.Name != have.Name {
			return fmt.Sprintf("output %d is %s, the golden notebook has %s", i, describe(have), describe(want))
		}
		var a, b string
		switch want.OutputType {
		case "stream":
			a, b = string(want.Text), string(have.Text)
		case "error":
			a, b = want.EName+": "+want.EValue, have.EName+": "+have.EValue
		default:
			a, b = string(want.Data["text/plain"]), string(have.Data["text/plain"])
		}
		if !TextMatches(mask(a, opt.IgnorePatterns), mask(b, opt.IgnorePatterns), opt.Tolerance) {
			return fmt.Sprintf("%s differs: got %q, golden %q%s", describe(have), clip(b), clip(a), note(opt))
		}
	}
	if len(g) != len(o) {
		return fmt.Sprintf("%d outputs, the golden notebook has %d", len(o), len(g))
	}
	return ""
}

func describe(o Output) string {
	if o.OutputType == "stream" {
		return o.OutputType + " " + o.Name
	}
	return o.OutputType
}

// mask replaces every match of the patterns by the same placeholder.
func mask(s string, patterns []*regexp.Regexp) string {
	for _, p := range patterns {
		s = p.ReplaceAllLiteralString(s, ignored)
	}
	return s
}

func note(opt Options) string {
	var parts []string
	if opt.Tolerance != 0 {
		parts = append(parts, fmt.Sprintf("numeric tolerance %g", opt.Tolerance))
	}
	if len(opt.IgnorePatterns) > 0 {
		parts = append(parts, fmt.Sprintf("%d ignore patterns", len(opt.IgnorePatterns)))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func clip(s string) string {
	const max = 200
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}

// number matches a decimal number, with sign, fraction and exponent.
var number = regexp.MustCompile(`[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?`)

// TextMatches says whether two output texts are the same once numbers within tol are taken as
// equal: the text between numbers must be identical, and so must the count of numbers.
func TextMatches(golden, got string, tol float64) bool {
	if golden == got {
		return true
	}
	gn, on := number.FindAllStringIndex(golden, -1), number.FindAllStringIndex(got, -1)
	if len(gn) != len(on) {
		return false
	}
	gp, op := 0, 0
	for i := range gn {
		if golden[gp:gn[i][0]] != got[op:on[i][0]] {
			return false
		}
		a, errA := strconv.ParseFloat(golden[gn[i][0]:gn[i][1]], 64)
		b, errB := strconv.ParseFloat(got[on[i][0]:on[i][1]], 64)
		if errA != nil || errB != nil {
			if golden[gn[i][0]:gn[i][1]] != got[on[i][0]:on[i][1]] {
				return false
			}
		} else if math.Abs(a-b) > tol*math.Max(1, math.Max(math.Abs(a), math.Abs(b))) {
			return false
		}
		gp, op = gn[i][1], on[i][1]
	}
	return golden[gp:] == got[op:]
}
