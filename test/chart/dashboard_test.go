package chart

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// dashboardFile is the Grafana dashboard the chart ships (metrics.grafanaDashboard).
const dashboardFile = "files/dashboards/cistern.json"

// TestChartGrafanaDashboard: metrics.grafanaDashboard renders the dashboard, as it is in
// files/dashboards, in a ConfigMap labelled grafana_dashboard: "1" for Grafana's sidecar, in the
// namespace asked for, with the labels and annotations asked for; off by default.
func TestChartGrafanaDashboard(t *testing.T) {
	const cm = "ConfigMap monitoring/cistern-grafana-dashboard"
	if objs := renderChart(t, namespace, ""); objs["ConfigMap "+namespace+"/cistern-grafana-dashboard"] != nil {
		t.Error("the defaults render the dashboard's ConfigMap")
	}
	objs := renderChart(t, namespace, `metrics: {grafanaDashboard: {enabled: true, namespace: monitoring,
  labels: {team: storage}, annotations: {grafana_folder: Storage}}}`)
	o := objs[cm]
	if o == nil {
		t.Fatalf("no %s in %v", cm, keys(objs))
	}
	labels := nested(o, "metadata", "labels").(map[string]any)
	if labels["grafana_dashboard"] != "1" || labels["team"] != "storage" || labels["app.kubernetes.io/part-of"] != "cistern" {
		t.Errorf("%s labels %v, want grafana_dashboard: \"1\", team and the chart's", cm, labels)
	}
	if a := nested(o, "metadata", "annotations", "grafana_folder"); a != "Storage" {
		t.Errorf("%s annotations %v", cm, nested(o, "metadata", "annotations"))
	}
	rendered, _ := nested(o, "data", "cistern.json").(string)
	want, err := os.ReadFile(filepath.Join(chartDir(), dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	var got, wantJSON map[string]any
	if err := json.Unmarshal([]byte(rendered), &got); err != nil {
		t.Fatalf("%s cistern.json: %v", cm, err)
	}
	if err := json.Unmarshal(want, &wantJSON); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d := cmp.Diff(wantJSON, got); d != "" {
		t.Errorf("the ConfigMap's dashboard differs from %s:\n%s", dashboardFile, d)
	}
	if objs := renderChart(t, "storage", "metrics: {grafanaDashboard: {enabled: true}}"); objs["ConfigMap storage/cistern-grafana-dashboard"] == nil {
		t.Errorf("without a namespace, the dashboard is not in the release's: %v", keys(objs))
	}
}

// TestDashboardMetricsExist: every metric the dashboard's queries name is one the code defines
// (pkg/ and cmd/: prometheus.NewDesc's names and the Name, Namespace and Subsystem of every
// metric's options; a histogram's _bucket, _sum and _count series), so that renaming a metric
// without the dashboard fails here. The one metric not Cistern's own, the CSI calls' latency,
// is csi-lib-utils' (metrics.NewCSIMetricsManagerForPlugin, which the driver must still call).
func TestDashboardMetricsExist(t *testing.T) {
	defined, csiPlugin := definedMetrics(t)
	if len(defined) < 30 || defined["cistern_dataset_fetched_bytes_total"] != "Counter" || defined["cistern_dataset_staging_bytes"] != "Desc" ||
		defined["cistern_volume_ready_seconds"] != "Histogram" {
		t.Fatalf("the scan of the code found %d metrics, not the ones it should: %v", len(defined), defined)
	}
	if !csiPlugin {
		t.Error("no code calls metrics.NewCSIMetricsManagerForPlugin: csi_plugin_operations_seconds is not exported")
	}
	defined["csi_plugin_operations_seconds"] = "Histogram"

	b, err := os.ReadFile(filepath.Join(chartDir(), dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	exprs := dashboardExprs(t, b)
	if len(exprs) < 30 {
		t.Fatalf("%d queries in the dashboard", len(exprs))
	}
	used := map[string]bool{}
	for _, e := range exprs {
		for _, name := range queryMetrics(e) {
			used[name] = true
			if !metricDefined(defined, name) {
				t.Errorf("the dashboard queries %s, which no code defines: %s", name, e)
			}
		}
	}
	// The panels the dashboard is for, by the metrics they need.
	for _, name := range []string{"cistern_pool_capacity_bytes", "cistern_pool_available_bytes", "cistern_dataset_cache_bytes",
		"cistern_dataset_staged_bytes_total", "cistern_volume_ready_seconds_bucket", "cistern_dataset_evictions_total",
		"cistern_dataset_fetched_bytes_total", "cistern_peer_served_bytes_total", "cistern_writeback_pending_bytes",
		"csi_plugin_operations_seconds_bucket"} {
		if !used[name] {
			t.Errorf("the dashboard has no query on %s", name)
		}
	}
	// A renamed metric is caught.
	if metricDefined(defined, "cistern_dataset_fetched_bytes") || metricDefined(defined, "cistern_pool_capacity_bytes_count") {
		t.Error("the check takes names the code does not define")
	}
}

var metricName = regexp.MustCompile(`\b(?:cistern|csi)_[a-zA-Z0-9_]+\b`)

// queryMetrics are the Cistern and CSI metric names a PromQL query names.
func queryMetrics(expr string) []string {
	return metricName.FindAllString(expr, -1)
}

// metricDefined: name is a defined metric, or a _bucket, _sum or _count series of a defined
// histogram (or summary).
func metricDefined(defined map[string]string, name string) bool {
	if defined[name] != "" {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && (defined[base] == "Histogram" || (defined[base] == "Summary" && suffix != "_bucket")) {
			return true
		}
	}
	return false
}

// dashboardExprs are the dashboard's queries: every panel target's expr (rows' panels too) and
// every query of its variables.
func dashboardExprs(t *testing.T, b []byte) []string {
	t.Helper()
	var d struct {
		Panels     []dashboardPanel `json:"panels"`
		Templating struct {
			List []struct {
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var exprs []string
	var walk func([]dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				if tg.Expr == "" {
					t.Errorf("panel %q has a target without expr", p.Title)
				}
				exprs = append(exprs, tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		switch q := v.Query.(type) {
		case string:
			if v.Type == "query" {
				exprs = append(exprs, q)
			}
		case map[string]any:
			if s, _ := q["query"].(string); s != "" {
				exprs = append(exprs, s)
			}
		}
	}
	return exprs
}

type dashboardPanel struct {
	Type    string                  `json:"type"`
	Title   string                  `json:"title"`
	Targets []struct{ Expr string } `json:"targets"`
	Panels  []dashboardPanel        `json:"panels"`
}

// definedMetrics reads the Go sources of pkg/ and cmd/ (tests left out) for the metrics they
// define, by full name, with their kind: Desc for prometheus.NewDesc (collectors), else the
// options' type less Opts (Counter, Gauge, Histogram, Summary). csiPlugin says whether any calls
// csi-lib-utils' metrics.NewCSIMetricsManagerForPlugin.
func definedMetrics(t *testing.T) (defined map[string]string, csiPlugin bool) {
	t.Helper()
	defined = map[string]string{}
	for _, top := range []string{"pkg", "cmd"} {
		dirs := map[string][]*ast.File{}
		fset := token.NewFileSet()
		err := filepath.WalkDir(filepath.Join(repoRoot(), top), func(path string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			dirs[filepath.Dir(path)] = append(dirs[filepath.Dir(path)], f)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for dir, files := range dirs {
			consts := stringConsts(files)
			str := func(e ast.Expr) (string, bool) { return evalString(e, consts) }
			for _, f := range files {
				ast.Inspect(f, func(n ast.Node) bool {
					switch n := n.(type) {
					case *ast.CallExpr:
						sel, ok := n.Fun.(*ast.SelectorExpr)
						if !ok {
							return true
						}
						switch sel.Sel.Name {
						case "NewCSIMetricsManagerForPlugin":
							csiPlugin = true
						case "NewDesc":
							if name, ok := str(n.Args[0]); ok {
								defined[name] = "Desc"
							} else {
								t.Logf("%s: a NewDesc whose name is not a constant", dir)
							}
						}
					case *ast.CompositeLit:
						kind := optsKind(n.Type)
						if kind == "" {
							return true
						}
						var parts [3]string // Namespace, Subsystem, Name
						for _, el := range n.Elts {
							kv, ok := el.(*ast.KeyValueExpr)
							if !ok {
								continue
							}
							key, _ := kv.Key.(*ast.Ident)
							if key == nil {
								continue
							}
							i := slices.Index([]string{"Namespace", "Subsystem", "Name"}, key.Name)
							if i < 0 {
								continue
							}
							if s, ok := str(kv.Value); ok {
								parts[i] = s
							} else {
								t.Logf("%s: a %sOpts whose %s is not a constant", dir, kind, key.Name)
							}
						}
						if parts[2] != "" {
							defined[strings.Join(slices.DeleteFunc(parts[:], func(s string) bool { return s == "" }), "_")] = kind
						}
					}
					return true
				})
			}
		}
	}
	return defined, csiPlugin
}

// optsKind is Counter, Gauge, Histogram or Summary for a metric options type (Prometheus' or
// component-base's), "" for any other.
func optsKind(typ ast.Expr) string {
	var name string
	switch e := typ.(type) {
	case *ast.SelectorExpr:
		name = e.Sel.Name
	case *ast.Ident:
		name = e.Name
	}
	for _, k := range []string{"Counter", "Gauge", "Histogram", "Summary"} {
		if name == k+"Opts" {
			return k
		}
	}
	return ""
}

// stringConsts are the string constants a package's files declare, at any level, by name.
func stringConsts(files []*ast.File) map[string]ast.Expr {
	consts := map[string]ast.Expr{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			if d, ok := n.(*ast.GenDecl); ok && d.Tok == token.CONST {
				for _, s := range d.Specs {
					vs := s.(*ast.ValueSpec)
					for i, name := range vs.Names {
						if i < len(vs.Values) {
							consts[name.Name] = vs.Values[i]
						}
					}
				}
			}
			return true
		})
	}
	return consts
}

// evalString evaluates a constant string expression: literals, constants and their sums.
func evalString(e ast.Expr, consts map[string]ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.STRING {
			s, err := strconv.Unquote(e.Value)
			return s, err == nil
		}
	case *ast.Ident:
		if v, ok := consts[e.Name]; ok {
			return evalString(v, consts)
		}
	case *ast.ParenExpr:
		return evalString(e.X, consts)
	case *ast.BinaryExpr:
		if e.Op == token.ADD {
			a, ok1 := evalString(e.X, consts)
			b, ok2 := evalString(e.Y, consts)
			return a + b, ok1 && ok2
		}
	}
	return "", false
}
