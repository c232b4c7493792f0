package cache

// The manifest's rules: which listed entries a dataset keeps (KeepEntry), and the digest that
// names a version of it (Digester), the same for the staging that writes a manifest and for the
// caller that proves it reads the same data (package access).

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"

	"github.com/cistern-csi/cistern/pkg/datasource/dataset"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// Digester folds manifest entries into one value that does not depend on their order: the
// sorted per-entry hashes, hashed. It holds 16 bytes per entry.
type Digester struct{ sums [][16]byte }

// Add folds one entry in.
func (d *Digester) Add(o source.Object) error {
	b, err := json.Marshal(o)
	if err != nil {
		return err
	}
	s := sha256.Sum256(b)
	d.sums = append(d.sums, [16]byte(s[:16]))
	return nil
}

// Sum is the digest of the entries added.
func (d *Digester) Sum() string {
	slices.SortFunc(d.sums, func(a, b [16]byte) int { return bytes.Compare(a[:], b[:]) })
	h := sha256.New()
	for _, s := range d.sums {
		h.Write(s[:])
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// KeepEntry is staging's filter over listed entries: it says whether o belongs to the dataset
// and refuses entries that could not be staged safely.
func KeepEntry(limits dataset.Limits, filter source.Filter, o source.Object) (bool, error) {
	var keep bool
	if o.Type == source.Dir {
		keep = filter.MatchDir(o.Key) && (len(filter.Include) == 0 || filter.Match(o.Key))
	} else {
		keep = filter.Match(o.Key)
	}
	if filter.Work.Spent() {
		return false, source.Errorf(source.TooLarge, "matching its include and exclude patterns against its keys took more than %d units of work (pattern bytes times key bytes), the most a listing may take on this node", limits.MaxGlobWork)
	}
	if !keep {
		return false, nil
	}
	if err := source.ValidateKey(o.Key); err != nil {
		return false, err
	}
	if err := limits.CheckKey(o.Key); err != nil {
		return false, err
	}
	if o.Type == source.Symlink {
		if err := source.ValidateSymlink(o.Key, o.Target); err != nil {
			return false, err
		}
	}
	if o.Size < 0 {
		return false, source.Errorf(source.Invalid, "entry %q has a negative size", o.Key)
	}
	return true, nil
}

// ListingDigest lists src as staging would and returns the digest of what it keeps.
func ListingDigest(ctx context.Context, src source.Source, spec *dataset.Spec, limits dataset.Limits) (string, error) {
	filter := limits.Filter(spec)
	var d Digester
	var bytes, listed int64
	err := src.List(ctx, func(o source.Object) error {
		if listed++; listed > limits.MaxObjects {
			return limits.CheckListed(listed)
		}
		keep, err := KeepEntry(limits, filter, o)
		if err != nil || !keep {
			return err
		}
		bytes += o.Size
		if err := limits.CheckTotals(int64(len(d.sums)+1), bytes); err != nil {
			return err
		}
		return d.Add(o)
	})
	if err != nil {
		return "", err
	}
	return d.Sum(), nil
}

// ManifestDigest is the digest of a committed manifest: from meta.json, or computed for a cache
// written before digests were recorded.
func ManifestDigest(dir string, md *Meta) (string, error) {
	if md.Digest != "" {
		return md.Digest, nil
	}
	var d Digester
	if err := EachObject(dir, func(_ int64, o source.Object) error { return d.Add(o) }); err != nil {
		return "", err
	}
	return d.Sum(), nil
}

// SampleFile returns a file of the manifest with at least one byte, chosen at random, and false
// when the dataset has none. It decodes only the lines it needs.
func SampleFile(dir string, objects int64) (source.Object, bool, error) {
	f, err := os.Open(filepath.Join(dir, ObjectsFile))
	if err != nil {
		return source.Object{}, false, err
	}
	defer f.Close()
	start := int64(0)
	if objects > 1 {
		start = mrand.Int64N(objects)
	}
	var first source.Object
	found := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for i := int64(0); sc.Scan(); i++ {
		if found && i < start {
			continue // the first match before start is kept as the wrap-around answer
		}
		var o source.Object
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			return source.Object{}, false, fmt.Errorf("corrupt manifest line %d: %w", i+1, err)
		}
		if o.Type != source.File || o.Size == 0 {
			continue
		}
		if i >= start {
			return o, true, nil
		}
		first, found = o, true
	}
	return first, found, sc.Err()
}
