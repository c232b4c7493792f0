package source

import (
	"strings"
	"testing"
)

// FuzzGlob: any include/exclude list a pod author writes either is refused by ParsePatterns or
// matches every key as the backtracking matcher does (on inputs small enough for it), and costs
// at most one segment match per pattern segment and key segment, per form of the pattern.
func FuzzGlob(f *testing.F) {
	for _, s := range [][2]string{
		{"**", "a/b/c"}, {"a/**/b", "a/x/y/b"}, {"**/*.json", "x/c.json"}, {"*.json", "deep/er/c.json"},
		{"a/*/b,**/a/**", "a/a/b/b"}, {"[a-", "a"}, {"\\", "x"}, {strings.Repeat("**/", 8) + "nomatch", "d0/d1/d2/d3/d4"},
		{"a/[!b]/c", "a/x/c"}, {"train/**,labels.csv", "train/n01/x.jpeg"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, patterns, key string) {
		pats, err := ParsePatterns(patterns)
		if err != nil {
			if KindOf(err) != Invalid {
				t.Fatalf("ParsePatterns(%q): error of kind %v: %v", patterns, KindOf(err), err)
			}
			return
		}
		if len(pats) > MaxPatterns {
			t.Fatalf("ParsePatterns(%q): %d patterns", patterns, len(pats))
		}
		segs := strings.Split(key, "/")
		// The reference is exponential in "**": compare only where it stays cheap.
		for _, p := range pats {
			ps := strings.Split(p, "/")
			if len(ps) > MaxPatternSegments {
				t.Fatalf("pattern %q of %d segments accepted", p, len(ps))
			}
			if strings.Count(p, "**") <= 3 && len(segs) <= 8 {
				if got, want := matchSegs(ps, segs), matchSegsNaive(ps, segs); got != want {
					t.Fatalf("match(%q, %q) = %v, backtracking says %v", p, key, got, want)
				}
			}
		}
		calls := 0
		old := segMatch
		segMatch = func(p, s string) bool { calls++; return old(p, s) }
		defer func() { segMatch = old }()
		f := Filter{Include: pats, Exclude: pats}
		f.Match(key)
		f.MatchDir(key)
		// Per pattern: key, key/** and base name for Match, twice more for MatchDir, for the
		// include and the exclude list; each at most (segments+1) x (key segments+1).
		bound := 0
		for _, p := range pats {
			bound += 6 * (len(strings.Split(p, "/")) + 2) * (len(segs) + 1)
		}
		if calls > bound {
			t.Fatalf("%d segment matches for %d patterns and a key of %d segments (bound %d)", calls, len(pats), len(segs), bound)
		}
	})
}
