package source

import (
	"path"
	"strings"
)

// Filter selects entries by glob patterns on their relative keys. A pattern is matched segment by
// segment with path.Match; "**" matches any number of segments, and a pattern without "/" also
// matches the base name anywhere ("*.json" selects every JSON file).
type Filter struct {
	Include []string
	Exclude []string
}

// ParsePatterns splits a comma-separated list and checks each pattern's syntax.
func ParsePatterns(s string) ([]string, error) {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		for seg := range strings.SplitSeq(p, "/") {
			if _, err := path.Match(seg, ""); err != nil {
				return nil, Errorf(Invalid, "bad glob pattern %q", p)
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// Match reports whether key is selected: it matches some include pattern (or there are none) and
// no exclude pattern.
func (f Filter) Match(key string) bool {
	if len(f.Include) > 0 && !matchAny(f.Include, key) {
		return false
	}
	return !matchAny(f.Exclude, key)
}

// MatchDir reports whether a directory could hold selected entries; used to prune walks. Only
// excludes can prune: an include like "**/*.json" may match at any depth.
func (f Filter) MatchDir(key string) bool {
	for _, p := range f.Exclude {
		if matchGlob(p, key) || matchGlob(p+"/**", key) {
			return false
		}
	}
	return true
}

func matchAny(patterns []string, key string) bool {
	for _, p := range patterns {
		if matchGlob(p, key) {
			return true
		}
		// A pattern naming a directory selects what it holds.
		if matchGlob(p+"/**", key) {
			return true
		}
		if !strings.Contains(p, "/") && matchGlob(p, path.Base(key)) {
			return true
		}
	}
	return false
}

func matchGlob(pattern, key string) bool {
	return matchSegs(strings.Split(pattern, "/"), strings.Split(key, "/"))
}

func matchSegs(pat, segs []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			for i := 0; i <= len(segs); i++ {
				if matchSegs(pat[1:], segs[i:]) {
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
