// Package specgate holds each ginkgo-driven suite (csi-sanity, the runs of Kubernetes' storage
// e2e) to the number of specs the repository says it must pass (expected.txt), so that a suite
// cannot pass empty: a focus that matches nothing, or specs that skip themselves, fail it. Specs
// that skipped themselves become skipped Go subtests with their reason, so that `make test`'s
// report lists them.
package specgate

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
)

//go:embed expected.txt
var expectedFile string

// Expected is the number of specs suite must pass, and whether expected.txt names it.
func Expected(suite string) (int, bool) {
	for _, line := range strings.Split(expectedFile, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || strings.HasPrefix(f[0], "#") || f[0] != suite {
			continue
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			panic(fmt.Sprintf("specgate: expected.txt: %q: %v", line, err))
		}
		return n, true
	}
	return 0, false
}

// Spec is one spec of a ginkgo report.
type Spec struct {
	Name    string
	State   string // passed, failed, skipped, pending, panicked, interrupted, aborted, timedout
	Message string // the failure's or the skip's message
}

// Selected says whether the run selected the spec: those its focus and skip leave out are
// reported as skipped without a message; the others that skip say why.
func (s Spec) Selected() bool { return s.State != "skipped" || s.Message != "" }

// jsonReport is the part of ginkgo's JSON report (--json-report, or []types.Report marshalled)
// read here.
type jsonReport []struct {
	SpecReports []struct {
		LeafNodeText  string   `json:"LeafNodeText"`
		ContainerText []string `json:"ContainerHierarchyTexts"`
		State         string   `json:"State"`
		LeafNodeType  string   `json:"LeafNodeType"`
		Failure       *struct {
			Message string `json:"Message"`
		} `json:"Failure"`
	} `json:"SpecReports"`
}

// Parse reads the specs (It nodes) of a ginkgo JSON report.
func Parse(data []byte) ([]Spec, error) {
	var rep jsonReport
	if err := json.Unmarshal(data, &rep); err != nil {
		return nil, err
	}
	var specs []Spec
	for _, suite := range rep {
		for _, s := range suite.SpecReports {
			if s.LeafNodeType != "It" {
				continue
			}
			spec := Spec{Name: strings.Join(append(s.ContainerText, s.LeafNodeText), " "), State: s.State}
			if s.Failure != nil {
				spec.Message = strings.TrimSpace(s.Failure.Message)
			}
			specs = append(specs, spec)
		}
	}
	return specs, nil
}

// ParseFile reads a ginkgo JSON report file.
func ParseFile(path string) ([]Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	specs, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("ginkgo report %s: %w", path, err)
	}
	return specs, nil
}

// Verdict is what Judge found in a run.
type Verdict struct {
	Counts  map[string]int // by state; "not selected" for the specs the run left out
	Skipped []Spec         // specs that skipped themselves, with their reason
	Failed  []Spec
	// Problems make the run fail: failed specs, or fewer passed than expected.txt says.
	Problems []string
	// Note is set when more specs passed than expected.txt says (raise the count).
	Note string
}

// Judge compares a run of suite with its expected count.
func Judge(suite string, specs []Spec) Verdict {
	v := Verdict{Counts: map[string]int{}}
	for _, s := range specs {
		switch {
		case !s.Selected():
			v.Counts["not selected"]++
		case s.State == "passed", s.State == "pending":
			v.Counts[s.State]++
		case s.State == "skipped":
			v.Counts[s.State]++
			v.Skipped = append(v.Skipped, s)
		default:
			v.Counts[s.State]++
			v.Failed = append(v.Failed, s)
			v.Problems = append(v.Problems, fmt.Sprintf("%s: %s: %s", s.State, s.Name, s.Message))
		}
	}
	passed := v.Counts["passed"]
	want, listed := Expected(suite)
	switch {
	case !listed && passed == 0:
		v.Problems = append(v.Problems, fmt.Sprintf("%s: no spec passed (%s)", suite, countsString(v.Counts)))
	case listed && passed < want:
		v.Problems = append(v.Problems, fmt.Sprintf("%s: %d specs passed, test/specgate/expected.txt says it must pass %d (%s)",
			suite, passed, want, countsString(v.Counts)))
	case listed && passed > want:
		v.Note = fmt.Sprintf("%s: %d specs passed, more than the %d of test/specgate/expected.txt: raise it", suite, passed, want)
	}
	return v
}

// Check judges a run of suite and reports it on t: the counts, every self-skipped spec as a
// skipped subtest with its reason, and an error for every problem.
func Check(t *testing.T, suite string, specs []Spec) {
	t.Helper()
	v := Judge(suite, specs)
	want, _ := Expected(suite)
	t.Logf("%s: %s (must pass: %d)", suite, countsString(v.Counts), want)
	for _, s := range v.Skipped {
		reason := s.Message
		t.Run("skipped "+s.Name, func(t *testing.T) { t.Skip(reason) })
	}
	if v.Note != "" {
		t.Log(v.Note)
	}
	for _, p := range v.Problems {
		t.Error(p)
	}
}

func countsString(c map[string]int) string {
	var keys []string
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d %s", c[k], k))
	}
	if len(parts) == 0 {
		return "no specs"
	}
	return strings.Join(parts, ", ")
}
