package source

import (
	"fmt"
	"path"
	"strings"
	"testing"
)

// matchSegsNaive is the backtracking matcher the linear one replaced: the reference for results.
func matchSegsNaive(pat, segs []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			for i := 0; i <= len(segs); i++ {
				if matchSegsNaive(pat[1:], segs[i:]) {
					return true
				}
			}
			return false
		}
		if len(segs) == 0 {
			return false
		}
		if ok, _ := path.Match(pat[0], segs[0]); !ok {
			return false
		}
		pat, segs = pat[1:], segs[1:]
	}
	return len(segs) == 0
}

func TestMatchSegsAgreesWithBacktracking(t *testing.T) {
	patterns := []string{"**", "a", "*", "a/**", "**/b", "a/**/b", "**/a/**", "**/**", "a/*/b", "**/*.json",
		"a/**/**/c", "*/**/b/*", "**/a/**/b/**"}
	keys := []string{"a", "b", "a/b", "a/x/b", "a/x/y/b", "c.json", "x/c.json", "a/b/c", "a/a/b/b", "x/a/y/b/z",
		"a/c", "a/x/c", "b/a"}
	for _, p := range patterns {
		for _, k := range keys {
			got := matchSegs(strings.Split(p, "/"), strings.Split(k, "/"))
			if want := matchSegsNaive(strings.Split(p, "/"), strings.Split(k, "/")); got != want {
				t.Errorf("match(%q, %q) = %v, want %v", p, k, got, want)
			}
		}
	}
}

// worstCase is a pattern of many "**" that never matches a deep key: backtracking tries every
// way to split the key among them.
func worstCase() (pattern, key string) {
	pattern = strings.Repeat("**/", 8) + "nomatch"
	segs := make([]string, 60)
	for i := range segs {
		segs[i] = fmt.Sprintf("d%d", i)
	}
	return pattern, strings.Join(segs, "/")
}

// TestMatchWorkIsBounded counts segment matches instead of timing: the worst case costs at most
// one match per (pattern segment, key segment) pair and pattern form (key, key/**, base name).
func TestMatchWorkIsBounded(t *testing.T) {
	orig := segMatch
	t.Cleanup(func() { segMatch = orig })
	calls := 0
	segMatch = func(p, s string) bool { calls++; return orig(p, s) }
	pattern, key := worstCase()
	if (Filter{Include: []string{pattern}}).Match(key) {
		t.Fatal("worst case matched")
	}
	pat, segs := len(strings.Split(pattern, "/"))+1, len(strings.Split(key, "/"))+1
	if limit := 3 * pat * segs; calls > limit {
		t.Fatalf("%d segment matches for %d pattern segments × %d key segments, want at most %d", calls, pat, segs, limit)
	}
}

func TestParsePatternsBounds(t *testing.T) {
	for _, tc := range []struct {
		name, patterns string
	}{
		{"too many patterns", strings.Repeat("a,", MaxPatterns+1)},
		{"too many segments", strings.Repeat("a/", MaxPatternSegments) + "a"},
		{"too long", strings.Repeat("a", MaxPatternLen+1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParsePatterns(tc.patterns)
			if err == nil || KindOf(err) != Invalid {
				t.Fatalf("ParsePatterns = %v, want an Invalid error", err)
			}
		})
	}
	if _, err := ParsePatterns(strings.Repeat("a,", MaxPatterns)); err != nil {
		t.Fatalf("%d patterns refused: %v", MaxPatterns, err)
	}
}

// BenchmarkFilterWorstCase is the pattern that took 39 s per key with backtracking.
func BenchmarkFilterWorstCase(b *testing.B) {
	pattern, key := worstCase()
	f := Filter{Include: []string{pattern}, Exclude: []string{pattern}}
	for b.Loop() {
		f.Match(key)
	}
}
