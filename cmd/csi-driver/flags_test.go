package main

import (
	"testing"

	"github.com/cistern-csi/cistern/pkg/driver"
)

// TestWritableDatasetsFlag: --writable-datasets takes layer (the default) or copy, and nothing
// else.
func TestWritableDatasetsFlag(t *testing.T) {
	for _, tc := range []struct {
		value    string
		copy, ok bool
	}{{"layer", false, true}, {"copy", true, true}, {"overlay", false, false}, {"", false, false}} {
		var cfg driver.Config
		o := options{writableDatasets: tc.value, tenantEndpoints: ""}
		err := o.complete(&cfg)
		if (err == nil) != tc.ok || cfg.Writable.Copy != tc.copy {
			t.Errorf("--writable-datasets=%q: copy %v, err %v", tc.value, cfg.Writable.Copy, err)
		}
	}
}
