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

// TestRemoveStartupTaintFlag: --remove-startup-taint needs the node it removes the taint from,
// and a plugin that serves that node.
func TestRemoveStartupTaintFlag(t *testing.T) {
	for _, tc := range []struct {
		node, mode string
		ok         bool
	}{{"n1", "all", true}, {"n1", "node", true}, {"", "all", false}, {"n1", "controller", false}} {
		cfg := driver.Config{NodeID: tc.node}
		o := options{writableDatasets: "layer", mode: tc.mode, removeStartupTaint: true}
		if err := o.complete(&cfg); (err == nil) != tc.ok {
			t.Errorf("--remove-startup-taint --node-id=%q --mode=%s: err %v", tc.node, tc.mode, err)
		}
	}
}
