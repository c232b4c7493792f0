package compare

import (
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
)

// Command is the name of the workload-controller subcommand that runs Main.
const Command = "compare-notebook"

// Main compares the executed notebook with the golden one:
//
//	compare-notebook --golden FILE --executed FILE [--tolerance T] [--ignore-output-type TYPE]... [--ignore-pattern REGEXP]...
//
// It exits 0 when they match, 1 with the first differing cell on stderr when they do not (the
// container's log tail becomes the job's message), 2 on bad arguments or unreadable notebooks.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(Command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	golden := fs.String("golden", "", "the golden notebook")
	executed := fs.String("executed", "", "the executed notebook")
	tolerance := fs.String("tolerance", "", "numeric tolerance (relative above 1, absolute below)")
	var opt Options
	fs.Func("ignore-output-type", "an output type to leave out: "+strings.Join(OutputTypes, ", ")+" (repeatable)", func(s string) error {
		if !slices.Contains(OutputTypes, s) {
			return fmt.Errorf("unknown output type %q", s)
		}
		opt.IgnoreTypes = append(opt.IgnoreTypes, s)
		return nil
	})
	fs.Func("ignore-pattern", "a regular expression whose matches are taken as equal (repeatable)", func(s string) error {
		re, err := regexp.Compile(s)
		if err != nil {
			return err
		}
		opt.IgnorePatterns = append(opt.IgnorePatterns, re)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return 2
	}
	tol, err := ParseTolerance(*tolerance)
	if err != nil || *golden == "" || *executed == "" {
		fmt.Fprintf(stderr, "%s: want --golden FILE --executed FILE [--tolerance T]: %v\n", Command, err)
		return 2
	}
	opt.Tolerance = tol
	read := func(path string) (*Notebook, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		return Parse(b)
	}
	g, err := read(*golden)
	if err != nil {
		fmt.Fprintf(stderr, "golden notebook %s: %v\n", *golden, err)
		return 2
	}
	e, err := read(*executed)
	if err != nil {
		fmt.Fprintf(stderr, "executed notebook %s: %v\n", *executed, err)
		return 2
	}
	if m := Compare(g, e, opt); m != nil {
		fmt.Fprintf(stderr, "output differs from the golden notebook: %v\n", m)
		return 1
	}
	fmt.Fprintf(stdout, "outputs match the golden notebook (%d cells)\n", len(e.Cells))
	return 0
}
