// Command crddocs drops the field descriptions of Kubernetes' own types embedded in a generated
// CRD, keeping the description of the embedding field itself.
//
// The LeaderWorkerSet CRD embeds two PodTemplateSpecs; with their field docs it is 1.4 MB, and a
// Helm release Secret (the chart and its rendered manifest) must stay under 1 MiB. Those docs are
// Kubernetes' own (`kubectl explain pod.spec`); every field of Cistern's types keeps its own.
//
//	crddocs FILE FIELD...   (FIELD is a dotted path in the schema, e.g. spec.template)
package main

import (
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/yaml"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: crddocs FILE FIELD...")
		os.Exit(2)
	}
	if err := trim(os.Args[1], os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "crddocs:", err)
		os.Exit(1)
	}
}

func trim(path string, fields []string) error {
	in, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var crd map[string]any
	if err := yaml.Unmarshal(in, &crd); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	versions, _ := dig(crd, "spec", "versions").([]any)
	if len(versions) == 0 {
		return fmt.Errorf("%s: not a CRD with versions", path)
	}
	for _, v := range versions {
		schema := dig(v, "schema", "openAPIV3Schema")
		for _, field := range fields {
			node := schema
			for _, name := range strings.Split(field, ".") {
				node = dig(node, "properties", name)
			}
			if node == nil {
				return fmt.Errorf("%s: no field %s", path, field)
			}
			for _, child := range asMap(node) {
				dropDescriptions(child)
			}
		}
	}
	out, err := yaml.Marshal(crd)
	if err != nil {
		return err
	}
	// controller-gen starts each file with a document separator; keep the file as it wrote it.
	return os.WriteFile(path, append([]byte("---\n"), out...), 0o644)
}

// dropDescriptions removes every description in a schema and the schemas under it. A property
// that is itself named "description" is a schema (a map), not a description (a string).
func dropDescriptions(node any) {
	switch n := node.(type) {
	case map[string]any:
		if _, ok := n["description"].(string); ok {
			delete(n, "description")
		}
		for _, v := range n {
			dropDescriptions(v)
		}
	case []any:
		for _, v := range n {
			dropDescriptions(v)
		}
	}
}

func dig(node any, keys ...string) any {
	for _, k := range keys {
		node = asMap(node)[k]
	}
	return node
}

func asMap(node any) map[string]any {
	m, _ := node.(map[string]any)
	return m
}
