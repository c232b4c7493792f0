package main

import (
	"testing"

	"github.com/cistern-csi/cistern/pkg/datasource"
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

// TestUnverifiableObjectsFlag: --unverifiable-objects takes refuse (the default) or serve, and
// nothing else.
func TestUnverifiableObjectsFlag(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  datasource.UnverifiablePolicy
		ok    bool
	}{{"refuse", datasource.RefuseUnverifiable, true}, {"serve", datasource.ServeUnverifiable, true},
		{"", datasource.RefuseUnverifiable, true}, {"skip", "", false}} {
		var cfg driver.Config
		o := options{writableDatasets: "layer", unverifiable: tc.value}
		err := o.complete(&cfg)
		if (err == nil) != tc.ok || tc.ok && cfg.Datasets.UnverifiableObjects != tc.want {
			t.Errorf("--unverifiable-objects=%q: policy %q, err %v", tc.value, cfg.Datasets.UnverifiableObjects, err)
		}
	}
}
