package logflags

import (
	"flag"
	"testing"
)

func TestRegister(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	c := Register(fs)
	for _, name := range []string{"logging-format", "v", "vmodule", "log-flush-frequency", "logtostderr", "log_file"} {
		if fs.Lookup(name) == nil {
			t.Errorf("flag --%s not registered", name)
		}
	}
	if err := fs.Parse([]string{"--logging-format=json", "-v=4"}); err != nil {
		t.Fatal(err)
	}
	if c.Format != "json" || c.Verbosity != 4 {
		t.Errorf("configuration: format %q, verbosity %d; want json, 4", c.Format, c.Verbosity)
	}
}

func TestApplyRefusesUnknownFormat(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	c := Register(fs)
	if err := fs.Parse([]string{"--logging-format=yaml"}); err != nil {
		t.Fatal(err)
	}
	if err := Apply(c); err == nil {
		t.Error("Apply accepted --logging-format=yaml")
	}
}
