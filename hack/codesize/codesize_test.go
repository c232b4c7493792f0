// Package codesize keeps the product code in parts a reader can take in: no file over MaxFileLines
// and no function over MaxFuncLines, outside generated code. Run it with
// `go test ./hack/codesize -v` to see the largest files and functions.
package codesize

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

const (
	MaxFileLines = 700
	MaxFuncLines = 80
)

// exempt are product trees not yet within the limits (none since pkg/datasource was split).
var exempt []string

type measure struct {
	where string
	lines int
}

// productFiles are the non-test, non-generated Go files under cmd/ and pkg/.
func productFiles(t *testing.T, root string) []string {
	var files []string
	for _, top := range []string{"cmd", "pkg"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if !strings.Contains(string(b[:min(len(b), 2048)]), "Code generated") {
				files = append(files, path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return files
}

func isExempt(rel string) bool {
	for _, e := range exempt {
		if rel == e || strings.HasPrefix(rel, e+"/") {
			return true
		}
	}
	return false
}

func TestProductCodeSizes(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files, funcs []measure
	for _, path := range productFiles(t, root) {
		rel, _ := filepath.Rel(root, path)
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, measure{rel, fset.Position(f.End()).Line})
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Body != nil {
				n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
				funcs = append(funcs, measure{rel + ":" + funcName(fn), n})
			}
		}
	}
	if len(files) < 50 {
		t.Fatalf("measured only %d files under %s", len(files), root)
	}
	check(t, "file", files, MaxFileLines)
	check(t, "function", funcs, MaxFuncLines)
}

func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	if ix, ok := typ.(*ast.IndexExpr); ok {
		typ = ix.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}

// check fails on every measure over max outside the exempt trees, and logs the ten largest.
func check(t *testing.T, kind string, all []measure, max int) {
	sort.Slice(all, func(i, j int) bool { return all[i].lines > all[j].lines })
	for i, m := range all {
		if i < 10 {
			t.Logf("%s %4d lines  %s", kind, m.lines, m.where)
		}
		if m.lines > max && !isExempt(m.where) {
			t.Errorf("%s %s has %d lines, more than %d", kind, m.where, m.lines, max)
		}
	}
}
