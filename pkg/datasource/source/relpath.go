package source

import (
	"strings"
)

// ValidateKey refuses a relative entry path that could land outside the dataset root. Each
// segment is checked as given: cleaning first would turn "a/../../x" into something harmless
// looking and hide the attempt.
func ValidateKey(key string) error {
	if key == "" {
		return Errorf(Unsafe, "empty entry name")
	}
	if strings.HasPrefix(key, "/") {
		return Errorf(Unsafe, "entry %q is an absolute path", key)
	}
	if strings.IndexByte(key, 0) >= 0 {
		return Errorf(Unsafe, "entry %q contains a NUL byte", key)
	}
	for seg := range strings.SplitSeq(key, "/") {
		switch seg {
		case "":
			return Errorf(Unsafe, "entry %q has an empty path segment", key)
		case ".", "..":
			return Errorf(Unsafe, "entry %q has a %q segment", key, seg)
		}
		if len(seg) > 255 {
			return Errorf(Unsafe, "entry %q has a segment longer than 255 bytes", key)
		}
	}
	return nil
}

// ValidateSymlink refuses a symlink whose target could resolve outside the dataset root. Only
// relative targets made of leading ".." segments (no more than the link's depth) followed by
// plain names are accepted: with every other link held to the same rule and parents being real
// directories, no chain of links can climb above the root.
func ValidateSymlink(key, target string) error {
	if target == "" || strings.HasPrefix(target, "/") {
		return Errorf(Unsafe, "symlink %q points to %q, outside the dataset", key, target)
	}
	depth := strings.Count(key, "/")
	ups, down := 0, false
	for seg := range strings.SplitSeq(target, "/") {
		switch {
		case seg == "..":
			if down {
				return Errorf(Unsafe, "symlink %q target %q climbs after descending", key, target)
			}
			ups++
		case seg == "" || seg == "." || strings.IndexByte(seg, 0) >= 0:
			return Errorf(Unsafe, "symlink %q target %q has an invalid segment", key, target)
		default:
			down = true
		}
	}
	if ups > depth {
		return Errorf(Unsafe, "symlink %q points to %q, outside the dataset", key, target)
	}
	return nil
}
