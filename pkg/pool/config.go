// Package pool knows the node's storage pools: the config that lists them, their capacity from
// statfs, their health, and which pool a new volume goes to.
package pool

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// Config is the pools config file: `pools: [{name: fast, path: /mnt/nvme0, labels: {media: ssd}}]`.
type Config struct {
	Pools []Spec `json:"pools"`
}

// Spec describes one pool as the admin configured it.
type Spec struct {
	// Name is unique on the node and is what StorageClasses target with `pool: <name>`.
	Name string `json:"name"`
	// Path is the mounted filesystem (or a directory on it) that holds the pool's volumes.
	Path string `json:"path"`
	// Labels are matched by the `poolSelector` StorageClass parameter.
	Labels map[string]string `json:"labels,omitempty"`
	// Shared marks a pool whose filesystem is reachable from several nodes under the same name
	// and path (for example a shared SAN filesystem). Each node's driver reports it and the
	// storagepool-sidecar merges the nodes into one StoragePool object.
	Shared bool `json:"shared,omitempty"`
}

// LoadConfig reads and validates a pools config file and resolves the pools' paths.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading pools config: %w", err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return nil, err
	}
	if err := cfg.ResolvePaths(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// ResolvePaths replaces each pool path by the path without symlinks. The kernel reports loop
// devices' backing files and mounts by their resolved paths; a pool reached through a symlink
// would otherwise be a different string from what the kernel says, and two names for one
// directory would make two pools of one filesystem. A path that does not exist yet (a disk not
// mounted) is kept as written: the pool is reported unhealthy until it appears.
func (c *Config) ResolvePaths() error {
	for i := range c.Pools {
		real, err := filepath.EvalSymlinks(c.Pools[i].Path)
		switch {
		case err == nil:
			c.Pools[i].Path = real
		case !os.IsNotExist(err):
			return fmt.Errorf("pool %q: resolving path %q: %w", c.Pools[i].Name, c.Pools[i].Path, err)
		}
	}
	return c.Validate()
}

// ParseConfig parses and validates a pools config document.
func ParseConfig(data []byte) (*Config, error) {
	var cfg Config
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return nil, fmt.Errorf("parsing pools config: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// Validate checks names and paths: names are DNS labels (they appear in volume IDs and object
// names), paths are absolute and distinct, label keys and values are valid Kubernetes labels.
func (c *Config) Validate() error {
	names := map[string]bool{}
	paths := map[string]string{}
	for i, p := range c.Pools {
		if errs := validation.IsDNS1123Label(p.Name); len(errs) > 0 {
			return fmt.Errorf("pools[%d]: invalid name %q: %v", i, p.Name, errs)
		}
		if names[p.Name] {
			return fmt.Errorf("pools[%d]: duplicate pool name %q", i, p.Name)
		}
		names[p.Name] = true
		if !filepath.IsAbs(p.Path) {
			return fmt.Errorf("pool %q: path %q is not absolute", p.Name, p.Path)
		}
		clean := filepath.Clean(p.Path)
		if other, ok := paths[clean]; ok {
			return fmt.Errorf("pool %q: path %q is already used by pool %q", p.Name, p.Path, other)
		}
		paths[clean] = p.Name
		for k, v := range p.Labels {
			if errs := validation.IsQualifiedName(k); len(errs) > 0 {
				return fmt.Errorf("pool %q: invalid label key %q: %v", p.Name, k, errs)
			}
			if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
				return fmt.Errorf("pool %q: invalid label value %q: %v", p.Name, v, errs)
			}
		}
	}
	sort.Slice(c.Pools, func(i, j int) bool { return c.Pools[i].Name < c.Pools[j].Name })
	return nil
}
