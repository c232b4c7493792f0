// Package overlayfs reads what the pods of a layered writable volume changed: the upper
// directory of its overlay (docs/datasets.md, "What a pod changed"). It is the reading side of
// the kernel's format, for the write-back of a volume's changes; it mounts nothing.
package overlayfs

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Kind is what an entry of the upper directory says about its path.
type Kind string

const (
	// Written: a file or symlink written whole in the upper layer (new, or changed and copied
	// up); its content is the upper entry's.
	Written Kind = "written"
	// Dir: a directory of the lower layer that holds changes below it (copied up), or that was
	// renamed (From); its lower contents still show, merged.
	Dir Kind = "dir"
	// Opaque: a directory through which nothing of a lower one of the same path shows: made by
	// the pod (the kernel marks the directories it makes so), or deleted and made again.
	Opaque Kind = "opaque"
	// Deleted: a whiteout; the lower entry of the path is gone.
	Deleted Kind = "deleted"
	// Metadata: only the mode, owner or times changed (a metacopy entry); the data is still the
	// lower file's, at From when set, else at the same path.
	Metadata Kind = "metadata"
)

// Change is one path the upper directory changes, relative to the volume's root.
type Change struct {
	Path string
	Kind Kind
	// From is the lower path a renamed directory or a metacopy file comes from (the overlay's
	// redirect), relative to the lower root; empty when it is Path itself.
	From string
}

// The overlay's own extended attributes (trusted.*: only the kernel and root write them).
const (
	xattrOpaque   = "trusted.overlay.opaque"
	xattrRedirect = "trusted.overlay.redirect"
	xattrMetacopy = "trusted.overlay.metacopy"
	xattrWhiteout = "trusted.overlay.whiteout"
)

// Changes lists the changes recorded in upper, the upper directory of an overlay that is not
// mounted (or mounted: the upper layer is read as it is on disk), parents before children.
func Changes(upper string) ([]Change, error) {
	var out []Change
	err := filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == upper {
			return err
		}
		rel, err := filepath.Rel(upper, p)
		if err != nil {
			return err
		}
		c, err := classify(p, d)
		if err != nil {
			return err
		}
		c.Path = filepath.ToSlash(rel)
		if c.From != "" {
			// A redirect is absolute from the lower root, or a name in the same parent.
			if strings.HasPrefix(c.From, "/") {
				c.From = strings.TrimPrefix(c.From, "/")
			} else {
				c.From = path.Join(path.Dir(c.Path), c.From)
			}
		}
		out = append(out, c)
		if c.Kind == Deleted && d.IsDir() {
			return filepath.SkipDir
		}
		return nil
	})
	return out, err
}

// Classify reads the upper entry at p alone (its Path empty, its From as the xattr says).
func Classify(p string) (Change, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return Change{}, err
	}
	return classify(p, fs.FileInfoToDirEntry(fi))
}

// classify reads one upper entry.
func classify(p string, d fs.DirEntry) (Change, error) {
	from := xattr(p, xattrRedirect)
	switch t := d.Type(); {
	case t&fs.ModeCharDevice != 0:
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return Change{}, err
		}
		if st.Rdev == 0 {
			return Change{Kind: Deleted}, nil
		}
	case t.IsDir():
		if xattr(p, xattrOpaque) == "y" {
			return Change{Kind: Opaque}, nil
		}
		return Change{Kind: Dir, From: from}, nil
	case t.IsRegular():
		// Whiteouts made inside a nested overlay are empty files with an xattr.
		if xattr(p, xattrWhiteout) != "" {
			return Change{Kind: Deleted}, nil
		}
		if hasXattr(p, xattrMetacopy) {
			return Change{Kind: Metadata, From: from}, nil
		}
	}
	return Change{Kind: Written}, nil
}

// xattr returns a path's extended attribute, "" when it has none.
func xattr(p, name string) string {
	buf := make([]byte, 4096)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

func hasXattr(p, name string) bool {
	_, err := unix.Lgetxattr(p, name, nil)
	return err == nil
}
