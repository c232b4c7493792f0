package peer

// Names of a manifest's entries among peers (docs/datasets.md, "Peer fan-out").

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"os"
	"slices"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// Names names a manifest's entries the same way on every node. Listings come in any order
// (prefixes are listed in parallel), so a manifest's line numbers differ between nodes; peers
// name an entry by its rank among the entries sorted by a hash of their keys, which equal
// manifests (equal digests) share. It costs 16 bytes per entry, only while peers are used.
type Names struct {
	rank []uint32 // manifest line -> rank
	line []uint32 // rank -> manifest line
	offs []int64  // where each line starts, and the manifest's end
}

// BuildNames reads the manifest (a dataset's objects.jsonl) once. Two keys with the same 64-bit hash (only a key
// crafted for it) leave the dataset without peers: an error.
func BuildNames(manifest string) (*Names, error) {
	f, err := os.Open(manifest)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c := &Names{offs: []int64{0}}
	var hashes []uint64
	r := bufio.NewReaderSize(f, 256<<10)
	var pos int64
	var line []byte
	for {
		part, err := r.ReadSlice('\n')
		pos += int64(len(part))
		line = append(line, part...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if len(line) > 0 && line[len(line)-1] == '\n' {
			var o struct {
				Key string `json:"k"`
			}
			if err := json.Unmarshal(line, &o); err != nil {
				return nil, fmt.Errorf("corrupt manifest line %d: %w", len(c.offs), err)
			}
			h := fnv.New64a()
			h.Write([]byte(o.Key))
			hashes = append(hashes, h.Sum64())
			c.offs = append(c.offs, pos)
			line = line[:0]
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if len(hashes) > math.MaxUint32 {
		return nil, errors.New("too many entries for peers")
	}
	c.line = make([]uint32, len(hashes))
	for k := range c.line {
		c.line[k] = uint32(k)
	}
	slices.SortFunc(c.line, func(a, b uint32) int { return cmp.Compare(hashes[a], hashes[b]) })
	c.rank = make([]uint32, len(hashes))
	for r, l := range c.line {
		if r > 0 && hashes[l] == hashes[c.line[r-1]] {
			return nil, errors.New("two keys of the manifest share a hash; the dataset is not shared with peers")
		}
		c.rank[l] = uint32(r)
	}
	return c, nil
}

// Entry reads the manifest entry of rank r; ErrNotHeld for a rank beyond it or an entry that is
// not a file.
func (c *Names) Entry(manifest string, r int64) (source.Object, error) {
	if r < 0 || r >= int64(len(c.line)) {
		return source.Object{}, ErrNotHeld
	}
	f, err := os.Open(manifest)
	if err != nil {
		return source.Object{}, err
	}
	defer f.Close()
	o, err := c.read(f, c.line[r])
	if err != nil {
		return source.Object{}, err
	}
	if o.Type != source.File {
		return source.Object{}, ErrNotHeld
	}
	return o, nil
}

// read decodes manifest line l.
func (c *Names) read(f *os.File, l uint32) (source.Object, error) {
	b := make([]byte, c.offs[l+1]-c.offs[l])
	if _, err := f.ReadAt(b, c.offs[l]); err != nil {
		return source.Object{}, err
	}
	var o source.Object
	if err := json.Unmarshal(b, &o); err != nil {
		return source.Object{}, fmt.Errorf("corrupt manifest line %d: %w", l+1, err)
	}
	return o, nil
}

// Rank is the name peers give manifest line i.
func (c *Names) Rank(i int64) int64 {
	if c != nil && i < int64(len(c.rank)) {
		return int64(c.rank[i])
	}
	return i
}

// Line is the manifest line of rank r.
func (c *Names) Line(r int64) int64 { return int64(c.line[r]) }

// Each calls fn with the line and entry of the manifest's entries of ranks [from, to), in rank
// order.
func (c *Names) Each(manifest string, from, to int64, fn func(int64, source.Object) error) error {
	f, err := os.Open(manifest)
	if err != nil {
		return err
	}
	defer f.Close()
	for r := max(from, 0); r < min(to, int64(len(c.line))); r++ {
		l := c.line[r]
		o, err := c.read(f, l)
		if err != nil {
			return err
		}
		if err := fn(int64(l), o); err != nil {
			return err
		}
	}
	return nil
}
