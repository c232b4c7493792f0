package specgate

import (
	"strings"
	"testing"
)

// A report as ginkgo writes it: two specs run, one skipped by itself, one left out by the focus.
const report = `[{"SpecReports":[
 {"LeafNodeType":"BeforeSuite","State":"passed"},
 {"LeafNodeType":"It","ContainerHierarchyTexts":["Node"],"LeafNodeText":"stages","State":"passed"},
 {"LeafNodeType":"It","ContainerHierarchyTexts":["Node"],"LeafNodeText":"publishes","State":"passed"},
 {"LeafNodeType":"It","ContainerHierarchyTexts":["Node"],"LeafNodeText":"expands","State":"skipped","Failure":{"Message":"Node expansion not supported\n"}},
 {"LeafNodeType":"It","ContainerHierarchyTexts":["Ctrl"],"LeafNodeText":"lists","State":"skipped"}
]}]`

func TestJudge(t *testing.T) {
	specs, err := Parse([]byte(report))
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 4 {
		t.Fatalf("parsed %d specs, want the 4 It nodes: %+v", len(specs), specs)
	}
	saved := expectedFile
	t.Cleanup(func() { expectedFile = saved })
	expectedFile = "# suite specs\ntwo 2\nthree 3\n"
	for _, tc := range []struct {
		name, suite string
		specs       []Spec
		problem     string // a substring of the only problem; "" for none
	}{
		{"as many as expected", "two", specs, ""},
		{"fewer than expected", "three", specs, "2 specs passed, test/specgate/expected.txt says it must pass 3"},
		{"focus matching nothing, listed", "two", nil, "0 specs passed"},
		{"focus matching nothing, not listed", "focus", nil, "focus: no spec passed"},
		{"everything skipped", "focus", specs[2:], "no spec passed"},
		{"one failed", "two", append(specs[:2:2], Spec{Name: "x", State: "failed", Message: "boom"}), "failed: x: boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := Judge(tc.suite, tc.specs)
			switch {
			case tc.problem == "" && len(v.Problems) > 0:
				t.Errorf("problems %q, want none", v.Problems)
			case tc.problem != "" && (len(v.Problems) != 1 || !strings.Contains(v.Problems[0], tc.problem)):
				t.Errorf("problems %q, want one with %q", v.Problems, tc.problem)
			}
		})
	}
	v := Judge("two", specs)
	if len(v.Skipped) != 1 || v.Skipped[0].Name != "Node expands" || v.Skipped[0].Message != "Node expansion not supported" {
		t.Errorf("skipped %+v, want the one that skipped itself", v.Skipped)
	}
	if v.Counts["not selected"] != 1 || v.Counts["passed"] != 2 {
		t.Errorf("counts %v", v.Counts)
	}
	if v := Judge("focus", specs[:1]); len(v.Problems) != 0 {
		t.Errorf("an unlisted suite with a passed spec: %q", v.Problems)
	}
}

func TestExpectedFileParses(t *testing.T) {
	for _, suite := range []string{"sanity", "k8s-e2e/subset", "k8s-e2e/storage", "k8s-e2e/snapshots", "k8s-e2e/streaming"} {
		if n, ok := Expected(suite); !ok || n < 1 {
			t.Errorf("expected.txt: %s: %d, %v", suite, n, ok)
		}
	}
}
