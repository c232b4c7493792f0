package source

import (
	"path"
	"strings"
	"sync/atomic"
)

// Filter selects entries by glob patterns on their relative keys. A pattern is matched segment by
// segment with path.Match; "**" matches any number of segments, and a pattern without "/" also
// matches the base name anywhere ("*.json" selects every JSON file).
type Filter struct {
	Include []string
	Exclude []string
	// Work, when set, is charged for every match (see Work); nil does not count.
	Work *Work
}

// Work is a budget of glob matching shared by the matches of one listing. A match of a pattern
// against a key is charged len(pattern) × len(key): an upper bound, up to a constant, of what
// matching segment by segment costs (each pattern segment is matched against each key segment at
// most once, and one segment match costs at most the product of their lengths). Once spent, the
// listing is refused: a pod author's patterns and a bucket's keys cannot burn the node's CPU
// without bound.
type Work struct {
	left atomic.Int64
}

// NewWork returns a budget of units.
func NewWork(units int64) *Work {
	w := &Work{}
	w.left.Store(units)
	return w
}

// Spent reports whether the budget is used up.
func (w *Work) Spent() bool { return w != nil && w.left.Load() < 0 }

func (w *Work) charge(pattern, key string) {
	if w != nil {
		w.left.Add(-int64(len(pattern)+1) * int64(len(key)+1))
	}
}

// Bounds on what a pod author may ask for: every listed key is matched against every pattern.
const (
	// MaxPatterns bounds the patterns of one include or exclude list.
	MaxPatterns = 64
	// MaxPatternSegments bounds the '/'-separated segments of one pattern.
	MaxPatternSegments = 32
	// MaxPatternLen bounds one pattern's length in bytes.
	MaxPatternLen = 1024
)

// ParsePatterns splits a comma-separated list and checks each pattern's syntax and size.
func ParsePatterns(s string) ([]string, error) {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if len(out) == MaxPatterns {
			return nil, Errorf(Invalid, "more than %d glob patterns", MaxPatterns)
		}
		if len(p) > MaxPatternLen {
			return nil, Errorf(Invalid, "glob pattern longer than %d bytes", MaxPatternLen)
		}
		segs := strings.Split(p, "/")
		if len(segs) > MaxPatternSegments {
			return nil, Errorf(Invalid, "glob pattern %q has more than %d segments", p, MaxPatternSegments)
		}
		for _, seg := range segs {
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
	if len(f.Include) > 0 && !f.matchAny(f.Include, key) {
		return false
	}
	return !f.matchAny(f.Exclude, key)
}

// MatchDir reports whether a directory could hold selected entries; used to prune walks. Only
// excludes can prune: an include like "**/*.json" may match at any depth.
func (f Filter) MatchDir(key string) bool {
	for _, p := range f.Exclude {
		f.Work.charge(p, key)
		f.Work.charge(p, key)
		if matchGlob(p, key) || matchGlob(p+"/**", key) {
			return false
		}
	}
	return true
}

func (f Filter) matchAny(patterns []string, key string) bool {
	for _, p := range patterns {
		// Charged for the three matches below, whether they run or not.
		for range 3 {
			f.Work.charge(p, key)
		}
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

// matchSegs matches pattern segments against key segments. Without "**" it is one pass. With
// it, trying every split for every "**" by recursion is exponential in their number (8 of them
// took 39 s against one deep key); instead one row of results per pattern segment is computed,
// from the last segment back: O(len(pat) × len(segs)) segment matches.
func matchSegs(pat, segs []string) bool {
	if !hasDoubleStar(pat) {
		if len(pat) != len(segs) {
			return false
		}
		for i := range pat {
			if !segMatch(pat[i], segs[i]) {
				return false
			}
		}
		return true
	}
	// next[j] says whether pat[i+1:] matches segs[j:]; cur is the row for pat[i:].
	n := len(segs)
	next, cur := make([]bool, n+1), make([]bool, n+1)
	next[n] = true // an empty pattern matches only the end
	for i := len(pat) - 1; i >= 0; i-- {
		for j := n; j >= 0; j-- {
			switch {
			case pat[i] == "**":
				// Zero segments, or one more and still at this "**".
				cur[j] = next[j] || j < n && cur[j+1]
			case j == n:
				cur[j] = false
			default:
				cur[j] = next[j+1] && segMatch(pat[i], segs[j])
			}
		}
		next, cur = cur, next
	}
	return next[0]
}

// segMatch matches one segment; a variable so tests can count the work.
var segMatch = func(pattern, seg string) bool {
	ok, _ := path.Match(pattern, seg)
	return ok
}

func hasDoubleStar(pat []string) bool {
	for _, p := range pat {
		if p == "**" {
			return true
		}
	}
	return false
}
