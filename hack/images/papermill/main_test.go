package main

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// outCell is what the tests read back of an executed cell.
type outCell struct {
	CellType       string `json:"cell_type"`
	ExecutionCount *int   `json:"execution_count"`
	Metadata       struct {
		Papermill struct {
			Status string `json:"status"`
		} `json:"papermill"`
	} `json:"metadata"`
	Outputs []struct {
		OutputType string `json:"output_type"`
		Text       string `json:"text"`
		Ename      string `json:"ename"`
		Evalue     string `json:"evalue"`
	} `json:"outputs"`
}

func writeNotebook(t *testing.T, path string, cells ...any) {
	t.Helper()
	var list []map[string]any
	for _, src := range cells {
		c := map[string]any{"cell_type": "code", "metadata": map[string]any{}, "outputs": []any{}, "execution_count": nil, "source": src}
		if s, ok := src.(string); ok && strings.HasPrefix(s, "# ") {
			c = map[string]any{"cell_type": "markdown", "metadata": map[string]any{}, "source": s}
		}
		list = append(list, c)
	}
	data, err := json.Marshal(map[string]any{"cells": list, "metadata": map[string]any{"kernelspec": map[string]any{"name": "python3"}}, "nbformat": 4, "nbformat_minor": 5})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func readCells(t *testing.T, path string) []outCell {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var nb struct {
		Cells    []outCell `json:"cells"`
		Metadata struct {
			Kernelspec map[string]any `json:"kernelspec"`
			Papermill  map[string]any `json:"papermill"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(data, &nb); err != nil {
		t.Fatal(err)
	}
	if nb.Metadata.Kernelspec == nil || nb.Metadata.Papermill == nil {
		t.Errorf("notebook metadata lost the kernelspec or lacks papermill: %+v", nb.Metadata)
	}
	return nb.Cells
}

func TestRun(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.MkdirAll(filepath.Join("data", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("data", "sub", "f"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	writeNotebook(t, "ok.ipynb",
		"# a markdown cell",
		[]string{"print hello\n", "# a comment\n", "\n", "print some text > data/out.txt\n", "cat data/out.txt\n"},
		"sha256 data\nls data\ndf data",
	)
	if err := run(options{input: "ok.ipynb", output: "ok.out.ipynb"}, io.Discard); err != nil {
		t.Fatalf("run: %v", err)
	}
	cells := readCells(t, "ok.out.ipynb")
	if len(cells) != 3 || cells[0].CellType != "markdown" || cells[0].ExecutionCount != nil {
		t.Fatalf("cells: %+v", cells)
	}
	for i, c := range cells[1:] {
		if c.ExecutionCount == nil || *c.ExecutionCount != i+1 || c.Metadata.Papermill.Status != "completed" {
			t.Errorf("cell %d: %+v", i+1, c)
		}
	}
	if got, want := cells[1].Outputs[0].Text, "hello\nsome text\n"; got != want {
		t.Errorf("cell 1 printed %q, want %q", got, want)
	}
	got := cells[2].Outputs[0].Text
	for _, want := range []string{
		fmt.Sprintf("%x  out.txt\n%x  sub/f\n", sha256.Sum256([]byte("some text\n")), sha256.Sum256([]byte("x\n"))),
		"out.txt\nsub/\n",
		"df data total=",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("cell 2 printed %q, want it to contain %q", got, want)
		}
	}
}

func TestRunFailure(t *testing.T) {
	for _, tc := range []struct {
		name, source, ename, evalue string
	}{
		{"fail statement", "fail the answer was 41", "NotebookFailure", "the answer was 41"},
		{"missing file", "cat /nonexistent", "StatementError", "cat /nonexistent: open /nonexistent: no such file or directory"},
		{"redirect to a missing directory", "print x > /nonexistent/f", "StatementError", "print x > /nonexistent/f: open /nonexistent/f: no such file or directory"},
		{"python", "import os", "StatementError", "import os: not a statement of the papermill stand-in"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Chdir(t.TempDir())
			writeNotebook(t, "nb.ipynb", "print before", tc.source, "print after")
			err := run(options{input: "nb.ipynb", output: "out.ipynb"}, io.Discard)
			var ee *executionError
			if !errors.As(err, &ee) || ee.count != 2 || ee.ename != tc.ename || ee.value != tc.evalue {
				t.Fatalf("run: %v, want the error %s: %s in cell 2", err, tc.ename, tc.evalue)
			}
			if !strings.Contains(err.Error(), `Exception encountered at "In [2]"`) {
				t.Errorf("error message %q", err)
			}
			cells := readCells(t, "out.ipynb")
			if s := cells[1].Metadata.Papermill.Status; s != "failed" {
				t.Errorf("failing cell status %q", s)
			}
			if o := cells[1].Outputs; len(o) != 1 || o[0].OutputType != "error" || o[0].Evalue != tc.evalue {
				t.Errorf("failing cell outputs %+v", o)
			}
			if c := cells[2]; c.Metadata.Papermill.Status != "pending" || c.ExecutionCount != nil || len(c.Outputs) != 0 {
				t.Errorf("the cell after the failure ran: %+v", c)
			}
		})
	}
}

func TestParseArgs(t *testing.T) {
	if o, err := parseArgs([]string{"in.ipynb", "out.ipynb", "--log-output"}); err != nil || o != (options{input: "in.ipynb", output: "out.ipynb", logOutput: true}) {
		t.Errorf("parseArgs = %+v, %v", o, err)
	}
	for _, args := range [][]string{{"in.ipynb"}, {"in.ipynb", "out.ipynb", "-p", "a", "1"}, {"a", "b", "c"}} {
		if _, err := parseArgs(args); err == nil {
			t.Errorf("parseArgs(%q) accepted", args)
		}
	}
}
