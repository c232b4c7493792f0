package compare

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// ResultsPrefix starts the line of the termination message that carries the per-cell results
// to the controller; the lines before it are the message a person reads.
const ResultsPrefix = "cistern-results: "

// ResultsBudget is the most bytes the results line may take: kubelet keeps 4096 bytes of a
// termination message, and the person's message before it needs some.
const ResultsBudget = 3200

// ReasonMax is the most characters of one failed cell's reason.
const ReasonMax = 200

// Results are what the results container reports: the executed notebook's SHA-256 and how each
// code cell fared. Compact on purpose: a termination message holds 4 KiB.
type Results struct {
	SHA256 string       `json:"sha256,omitempty"`
	Passed []int        `json:"passed,omitempty"`
	Failed []FailedCell `json:"failed,omitempty"`
	// Omitted counts code cells left out to fit the budget.
	Omitted int `json:"omitted,omitempty"`
}

// FailedCell is a failed code cell: its index among all cells and why.
type FailedCell struct {
	Cell   int    `json:"i"`
	Reason string `json:"m,omitempty"`
}

// Cells compares each code cell of got with the golden notebook's code cell of the same rank
// (nil golden: only whether it raised an error) and returns the results.
func Cells(golden, got *Notebook, opt Options) Results {
	var r Results
	var gc []int
	if golden != nil {
		gc = codeCells(golden)
	}
	for rank, i := range codeCells(got) {
		var what string
		switch {
		case golden == nil:
			what = raised(got.Cells[i].Outputs)
		case rank >= len(gc):
			what = fmt.Sprintf("the golden notebook has no code cell %d (it has %d)", rank+1, len(gc))
		default:
			what = compareOutputs(golden.Cells[gc[rank]].Outputs, got.Cells[i].Outputs, opt)
		}
		if what == "" {
			r.Passed = append(r.Passed, i)
		} else {
			r.Failed = append(r.Failed, FailedCell{Cell: i, Reason: what})
		}
	}
	return r
}

// raised describes the first error output, if any.
func raised(outs []Output) string {
	for _, o := range outs {
		if o.OutputType == "error" {
			return "raised " + o.EName + ": " + o.EValue
		}
	}
	return ""
}

// Encode is the results line, at most budget bytes: reasons are shortened first, then cells are
// left out (counted in Omitted), failed ones last.
func (r Results) Encode(budget int) string {
	for i := range r.Failed {
		r.Failed[i].Reason = clipRunes(r.Failed[i].Reason, ReasonMax)
	}
	for {
		b, _ := json.Marshal(r)
		line := ResultsPrefix + string(b)
		if len(line) <= budget {
			return line
		}
		// An index takes at most 12 bytes: dropping over/12+1 never drops more than needed.
		over := len(line) - budget
		switch {
		case shorten(r.Failed):
		case len(r.Passed) > 0:
			n := min(len(r.Passed), over/12+1)
			r.Passed, r.Omitted = r.Passed[:len(r.Passed)-n], r.Omitted+n
		case len(r.Failed) > 0:
			r.Failed, r.Omitted = r.Failed[:len(r.Failed)-1], r.Omitted+1
		default:
			return line // the SHA-256 alone always fits
		}
	}
}

// shorten halves every reason above 40 characters; false when none is.
func shorten(f []FailedCell) bool {
	done := false
	for i := range f {
		if n := utf8.RuneCountInString(f[i].Reason); n > 40 {
			f[i].Reason, done = clipRunes(f[i].Reason, n/2), true
		}
	}
	return done
}

func clipRunes(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

// ParseResults splits a termination message into the person's message and the results line;
// ok is false when it has none (or a malformed one).
func ParseResults(msg string) (human string, r Results, ok bool) {
	before, line, found := strings.Cut(msg, ResultsPrefix)
	if !found {
		return msg, r, false
	}
	human = strings.TrimRight(before, "\n")
	line, _, _ = strings.Cut(line, "\n")
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		return human, Results{}, false
	}
	return human, r, true
}
