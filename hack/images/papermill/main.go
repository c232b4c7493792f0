// Command papermill stands in for papermill in the node-level tests' notebook image. It tests the
// plumbing of a notebook validation pod (the cloned repository, the working directory, the user
// volumes at their mount paths, the output volume, exit codes), not notebooks: there is no Python.
//
//	papermill INPUT OUTPUT [--log-output]
//
// reads the notebook INPUT (nbformat 4 JSON), runs its code cells in order and writes the executed
// notebook to OUTPUT, with each cell's outputs, execution_count and papermill status, as papermill
// does. A code cell holds statements of a tiny language, one per line (see statements.go): print,
// cat, ls, sha256, df, sleep, fail, each optionally redirected to a file. A statement that fails (a missing file, `fail`, anything
// that is not a statement) fails its cell: like papermill, the stand-in then leaves the remaining
// cells pending, still writes OUTPUT, prints a PapermillExecutionError to stderr and exits 1.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// version is what the output notebook's metadata.papermill.version says.
const version = "stand-in (Cistern node tests, hack/images/papermill)"

type options struct {
	input, output string
	logOutput     bool
}

func main() {
	opts, err := parseArgs(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\nUsage: papermill INPUT OUTPUT [--log-output] (stand-in of the Cistern node tests)\n", err)
		os.Exit(2)
	}
	if err := run(opts, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func parseArgs(args []string) (options, error) {
	var o options
	var pos []string
	for _, a := range args {
		switch {
		case a == "--log-output":
			o.logOutput = true
		case strings.HasPrefix(a, "-"):
			return o, fmt.Errorf("option %s is not implemented by the stand-in", a)
		default:
			pos = append(pos, a)
		}
	}
	if len(pos) != 2 {
		return o, errors.New("want an input and an output notebook")
	}
	o.input, o.output = pos[0], pos[1]
	return o, nil
}

// executionError is papermill's PapermillExecutionError: the cell that failed and why.
type executionError struct {
	count int
	ename string
	value string
}

func (e *executionError) Error() string {
	return fmt.Sprintf("PapermillExecutionError: Exception encountered at \"In [%d]\":\n%s: %s", e.count, e.ename, e.value)
}

func run(o options, log io.Writer) error {
	data, err := os.ReadFile(o.input)
	if err != nil {
		return fmt.Errorf("reading the input notebook: %w", err)
	}
	nb, err := decodeNotebook(data)
	if err != nil {
		return fmt.Errorf("%s: %w", o.input, err)
	}
	start := time.Now()
	fmt.Fprintf(log, "Input Notebook:  %s\nOutput Notebook: %s\n", o.input, o.output)
	execErr := nb.execute(o.logOutput, log)
	end := time.Now()
	nb.setMetadata("papermill", map[string]any{
		"version":     version,
		"input_path":  o.input,
		"output_path": o.output,
		"start_time":  start.UTC().Format(time.RFC3339Nano),
		"end_time":    end.UTC().Format(time.RFC3339Nano),
		"duration":    end.Sub(start).Seconds(),
		"exception":   execErr != nil,
	})
	out, err := nb.encode()
	if err != nil {
		return err
	}
	if err := os.WriteFile(o.output, out, 0o644); err != nil {
		return fmt.Errorf("writing the output notebook: %w", err)
	}
	if execErr != nil {
		return execErr
	}
	return nil
}

// notebook keeps every field of the input as it was and changes only what execution changes.
type notebook struct {
	fields map[string]json.RawMessage
	cells  []map[string]json.RawMessage
}

func decodeNotebook(data []byte) (*notebook, error) {
	nb := &notebook{}
	if err := json.Unmarshal(data, &nb.fields); err != nil {
		return nil, fmt.Errorf("not a notebook: %w", err)
	}
	var format int
	if err := json.Unmarshal(nb.fields["nbformat"], &format); err != nil || format != 4 {
		return nil, fmt.Errorf("nbformat %s is not supported, want 4", nb.fields["nbformat"])
	}
	if err := json.Unmarshal(nb.fields["cells"], &nb.cells); err != nil {
		return nil, fmt.Errorf("cells: %w", err)
	}
	return nb, nil
}

func (nb *notebook) setMetadata(key string, value any) {
	md := map[string]json.RawMessage{}
	if raw, ok := nb.fields["metadata"]; ok {
		_ = json.Unmarshal(raw, &md)
	}
	md[key] = mustJSON(value)
	nb.fields["metadata"] = mustJSON(md)
}

func (nb *notebook) encode() ([]byte, error) {
	nb.fields["cells"] = mustJSON(nb.cells)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", " ")
	if err := enc.Encode(nb.fields); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// execute runs the code cells in order until one fails; the cells after it stay pending.
func (nb *notebook) execute(logOutput bool, log io.Writer) error {
	count := 0
	var failed *executionError
	for _, c := range nb.cells {
		var kind string
		_ = json.Unmarshal(c["cell_type"], &kind)
		if kind != "code" {
			continue
		}
		if failed != nil {
			setCellMetadata(c, map[string]any{"status": "pending", "exception": nil})
			continue
		}
		count++
		source, err := cellSource(c["source"])
		start := time.Now()
		var stdout bytes.Buffer
		if err == nil {
			err = runStatements(source, &stdout)
		}
		end := time.Now()
		outputs := []map[string]any{}
		if stdout.Len() > 0 {
			outputs = append(outputs, map[string]any{"output_type": "stream", "name": "stdout", "text": stdout.String()})
		}
		status := "completed"
		if err != nil {
			status = "failed"
			failed = &executionError{count: count, ename: errorName(err), value: err.Error()}
			outputs = append(outputs, map[string]any{
				"output_type": "error", "ename": failed.ename, "evalue": failed.value,
				"traceback": []string{failed.ename + ": " + failed.value},
			})
		}
		if logOutput {
			fmt.Fprintf(log, "Executing Cell %d---------------------------------------\n%s", count, stdout.String())
		}
		c["execution_count"] = mustJSON(count)
		c["outputs"] = mustJSON(outputs)
		setCellMetadata(c, map[string]any{
			"status":     status,
			"exception":  err != nil,
			"start_time": start.UTC().Format(time.RFC3339Nano),
			"end_time":   end.UTC().Format(time.RFC3339Nano),
			"duration":   end.Sub(start).Seconds(),
		})
	}
	if failed != nil {
		return failed
	}
	return nil
}

func setCellMetadata(c map[string]json.RawMessage, papermill map[string]any) {
	md := map[string]json.RawMessage{}
	_ = json.Unmarshal(c["metadata"], &md)
	md["papermill"] = mustJSON(papermill)
	c["metadata"] = mustJSON(md)
}

// cellSource joins a cell's source, which nbformat allows as a string or a list of lines.
func cellSource(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var lines []string
	if err := json.Unmarshal(raw, &lines); err != nil {
		return "", fmt.Errorf("cell source is neither a string nor a list of strings")
	}
	return strings.Join(lines, ""), nil
}

func mustJSON(v any) json.RawMessage {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err) // only maps, slices and scalars built here
	}
	return data
}
