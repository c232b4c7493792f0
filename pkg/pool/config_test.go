package pool

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		wantErr string
		pools   int
	}{
		{name: "two pools sorted", doc: "pools:\n- {name: slow, path: /b}\n- {name: fast, path: /a, labels: {media: ssd}}\n", pools: 2},
		{name: "empty", doc: "pools: []\n", pools: 0},
		{name: "failure case - unknown field", doc: "pools:\n- {name: a, path: /a, size: 3}\n", wantErr: "unknown field"},
		{name: "failure case - bad name", doc: "pools:\n- {name: Fast_1, path: /a}\n", wantErr: "invalid name"},
		{name: "failure case - relative path", doc: "pools:\n- {name: a, path: data}\n", wantErr: "not absolute"},
		{name: "failure case - duplicate name", doc: "pools:\n- {name: a, path: /a}\n- {name: a, path: /b}\n", wantErr: "duplicate pool name"},
		{name: "failure case - duplicate path", doc: "pools:\n- {name: a, path: /a}\n- {name: b, path: /a/}\n", wantErr: "already used"},
		{name: "failure case - bad label", doc: "pools:\n- {name: a, path: /a, labels: {\"bad key!\": x}}\n", wantErr: "invalid label key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(tc.doc))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("want error containing %q, got %v", tc.wantErr, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(cfg.Pools) != tc.pools {
				t.Fatalf("want %d pools, got %d", tc.pools, len(cfg.Pools))
			}
			for i := 1; i < len(cfg.Pools); i++ {
				if cfg.Pools[i-1].Name > cfg.Pools[i].Name {
					t.Fatalf("pools not sorted: %v", cfg.Pools)
				}
			}
		})
	}
}

func TestLoadConfigResolvesPaths(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "disk")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	write := func(doc string) string {
		p := filepath.Join(dir, "pools.yaml")
		if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg, err := LoadConfig(write("pools:\n- {name: a, path: " + dir + "/link}\n- {name: b, path: " + dir + "/missing}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Pools[0].Path; got != real {
		t.Errorf("pool through a symlink: path %q, want %q", got, real)
	}
	if got := cfg.Pools[1].Path; got != filepath.Join(dir, "missing") {
		t.Errorf("missing pool path %q, want it as written", got)
	}
	_, err = LoadConfig(write("pools:\n- {name: a, path: " + dir + "/link}\n- {name: b, path: " + real + "}\n"))
	if err == nil || !strings.Contains(err.Error(), "already used") {
		t.Fatalf("two names for one directory: %v, want refused", err)
	}
}
