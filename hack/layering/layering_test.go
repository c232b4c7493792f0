// Package layering holds the product code to its intended layers: the CSI layer (pkg/driver)
// over the volume service (pkg/volume) over the data engine's parts (pkg/datasource/...,
// pkg/streamfs, pkg/writeback, pkg/image) over the pools and records (pkg/pool, pkg/state), with
// the shared contract (names, IDs, parameters, API types) at the bottom, and the controller side
// (pkg/workloads, pkg/poolpublisher) beside the node's data plane, never linking it. Each rule
// is a "never", checked over the imports `go list` reports; TestEveryRuleCatchesItsViolation
// shows that each one fails when a forbidden import is added.
package layering

import (
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/cistern-csi/cistern/"

// contract is what every binary shares: it imports nothing of Cistern but itself.
var contract = []string{"pkg/consts", "pkg/ids", "pkg/units", "pkg/params", "pkg/apis/...", "pkg/datasource/source", "pkg/atomicfile"}

// dataPlane is what only the node plugin links.
var dataPlane = []string{"pkg/datasource/...", "pkg/volume", "pkg/driver", "pkg/image", "pkg/pool", "pkg/state",
	"pkg/streamfs", "pkg/writeback/...", "pkg/overlayfs", "pkg/fusekeeper", "pkg/peerdirectory", "pkg/outputevents", "pkg/nodeevents"}

// rule: no package matching from imports a Cistern package matching never, unless it also
// matches except. A pattern is a path under the module; "/..." matches it and what is below.
type rule struct {
	name   string
	from   []string
	never  []string
	except []string
}

var rules = []rule{
	{name: "the contract imports only the contract",
		from: contract, never: []string{"pkg/...", "cmd/..."}, except: contract},
	{name: "datasource/source is a leaf params may import",
		from: []string{"pkg/datasource/source"}, never: []string{"pkg/...", "cmd/..."}},
	{name: "pools and records are the bottom layer",
		from: []string{"pkg/pool", "pkg/state"}, never: []string{"pkg/...", "cmd/..."}, except: []string{"pkg/atomicfile", "pkg/consts", "pkg/units"}},
	{name: "the data engine reaches neither up to volumes nor to the Kubernetes API types",
		from: []string{"pkg/datasource/..."},
		never: []string{"pkg/volume", "pkg/driver", "pkg/rpc/...", "pkg/pool", "pkg/state", "pkg/streamfs", "pkg/writeback/...",
			"pkg/image", "pkg/workloads/...", "pkg/poolpublisher/...", "pkg/peerdirectory", "pkg/outputevents", "pkg/apis/..."}},
	{name: "the data engine's parts do not know the volume service or the coordinator",
		from:  []string{"pkg/datasource/...", "pkg/streamfs", "pkg/writeback/...", "pkg/image", "pkg/overlayfs", "pkg/fusekeeper"},
		never: []string{"pkg/volume", "pkg/driver", "pkg/datasource"}},
	{name: "the volume service never calls up into the CSI layer or out to the API server",
		from:  []string{"pkg/volume"},
		never: []string{"pkg/driver", "pkg/rpc/...", "pkg/poolpublisher/...", "pkg/workloads/...", "pkg/peerdirectory", "pkg/outputevents", "pkg/apis/..."}},
	{name: "the CSI layer reaches the data engine through the volume service and the coordinator only",
		from:   []string{"pkg/driver"},
		never:  []string{"pkg/datasource/...", "pkg/streamfs", "pkg/writeback/...", "pkg/image", "pkg/overlayfs", "pkg/fusekeeper"},
		except: []string{"pkg/datasource", "pkg/datasource/peer"}},
	{name: "the controller side never links the node's data plane",
		from: []string{"pkg/workloads/...", "pkg/poolpublisher/...", "cmd/workload-controller", "cmd/storagepool-sidecar"}, never: dataPlane},
	{name: "product code never imports commands or tests",
		from: []string{"pkg/...", "cmd/..."}, never: []string{"cmd/...", "test/...", "hack/...", "sanity"}},
}

// match says whether the module-relative path p matches pattern.
func match(pattern, p string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return p == base || strings.HasPrefix(p, base+"/")
	}
	return p == pattern
}

func matchAny(patterns []string, p string) bool {
	return slices.ContainsFunc(patterns, func(pattern string) bool { return match(pattern, p) })
}

// violations lists the imports of graph (module-relative package → its Cistern imports) that
// break r, and how many packages r applied to.
func (r rule) violations(graph map[string][]string) (bad []string, applied int) {
	for pkg, imports := range graph {
		if !matchAny(r.from, pkg) {
			continue
		}
		applied++
		for _, imp := range imports {
			if imp != pkg && matchAny(r.never, imp) && !matchAny(r.except, imp) {
				bad = append(bad, pkg+" imports "+imp)
			}
		}
	}
	slices.Sort(bad)
	return bad, applied
}

// importGraph runs go list over the product packages (with the build tags of make's GOFLAGS,
// so cgo-only files count) and returns each package's imports within the module.
func importGraph(t *testing.T) map[string][]string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command lists the imports: %v", err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goTool, "list", "-json=ImportPath,Imports", "./cmd/...", "./pkg/...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	graph := map[string][]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		name, ok := strings.CutPrefix(p.ImportPath, module)
		if !ok {
			continue
		}
		graph[name] = []string{}
		for _, imp := range p.Imports {
			if rel, ok := strings.CutPrefix(imp, module); ok {
				graph[name] = append(graph[name], rel)
			}
		}
	}
	return graph
}

func TestLayering(t *testing.T) {
	graph := importGraph(t)
	if len(graph) < 40 {
		t.Fatalf("go list found %d packages of the module, want the whole product", len(graph))
	}
	for _, r := range rules {
		bad, applied := r.violations(graph)
		if applied == 0 {
			t.Errorf("rule %q applies to no package: its patterns are stale", r.name)
		}
		for _, b := range bad {
			t.Errorf("%s: %s", r.name, b)
		}
	}
}

// TestEveryRuleCatchesItsViolation adds, for each rule and each of its never patterns, one
// forbidden import to the real graph and checks that the rule reports it: a rule that cannot
// fail checks nothing.
func TestEveryRuleCatchesItsViolation(t *testing.T) {
	graph := importGraph(t)
	checked := 0
	for _, r := range rules {
		var from string
		for pkg := range graph {
			if matchAny(r.from, pkg) && (from == "" || pkg < from) {
				from = pkg
			}
		}
		for _, never := range r.never {
			target := strings.TrimSuffix(never, "/...")
			if matchAny(r.except, target) {
				target += "/forbidden" // a package below the pattern the exception does not cover
			}
			if target == from {
				continue
			}
			g := map[string][]string{}
			for k, v := range graph {
				g[k] = v
			}
			g[from] = append(slices.Clone(graph[from]), target)
			bad, _ := r.violations(g)
			want := fmt.Sprintf("%s imports %s", from, target)
			if !slices.Contains(bad, want) {
				t.Errorf("rule %q did not catch %q (found %v)", r.name, want, bad)
			}
			checked++
		}
	}
	if checked < len(rules) {
		t.Fatalf("checked %d forbidden imports for %d rules", checked, len(rules))
	}
	t.Logf("%d rules, %d forbidden imports each caught", len(rules), checked)
}
