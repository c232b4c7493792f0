package streamfs

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"hash"
	"io"
	"strconv"
	"sync"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/pkg/datasource/stage"
)

// wholeStreams is how many ranged GETs read an object checked as a whole, and wholeRange the
// most each asks for, as the staging engine reads a large object. One GET checked as it streams
// went at about 270 MB/s on the bench machine (the first byte of a 2 GiB object after 7.7 s),
// a sixth of the staging of the same object beside it (docs/benchmarks.md).
const wholeStreams = 4

var wholeRange int64 = 32 << 20 // a variable for the tests' small objects

// inRanges reports whether a whole-object read can go in parallel ranges: the object's
// full-object CRC combines from the ranges' CRCs, or its ETag is the MD5 of parts of a known
// size (each range then holds whole parts).
func (s *stream) inRanges(obj source.Object) bool {
	if obj.Size <= wholeRange {
		return false
	}
	if sum := s.layout.Checksum; sum.Algorithm != "" {
		return stage.Combinable(sum.Algorithm)
	}
	return s.layout.PartSize > 0 && multipartETag.MatchString(obj.ETag)
}

// fetchWholeInRanges reads an object checked as a whole in ranges, several at a time, each
// range's CRC (or each part's MD5) taken as its bytes stream into the scratch file; the object
// is then checked as a whole: the ranges' CRCs combined against its full-object checksum, or
// the parts' MD5s against its ETag. As with one GET, nothing is handed out before that check.
func (s *stream) fetchWholeInRanges(ctx context.Context, f *fileNode) error {
	size, unit := f.obj.Size, wholeRange
	crc := s.layout.Checksum.Algorithm
	if crc == "" {
		unit = max(1, wholeRange/s.layout.PartSize) * s.layout.PartSize // whole parts
	}
	ranges := (size + unit - 1) / unit
	sums := make([][][]byte, ranges) // per range: one CRC, or one MD5 per part
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		next  int64
		first error
		wg    sync.WaitGroup
	)
	take := func() (int64, bool) {
		mu.Lock()
		defer mu.Unlock()
		i := next
		next++
		return i, i < ranges && first == nil
	}
	for range min(int64(wholeStreams), ranges) {
		wg.Go(func() {
			for {
				i, ok := take()
				if !ok {
					return
				}
				sum, err := s.fetchRange(ctx, f, i*unit, min(unit, size-i*unit), crc)
				mu.Lock()
				if err != nil && first == nil {
					first = err
				}
				sums[i] = sum
				mu.Unlock()
				if err != nil {
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	if crc != "" {
		flat, lens := make([][]byte, ranges), make([]int64, ranges)
		for i := range sums {
			flat[i], lens[i] = sums[i][0], min(unit, size-int64(i)*unit)
		}
		if got := stage.CombineCRCs(crc, flat, lens); got != s.layout.Checksum.Value {
			return source.Errorf(source.Corrupt, "%q: %s %s does not match %s", f.obj.Key, crc, got, s.layout.Checksum.Value)
		}
		return nil
	}
	all, parts := md5.New(), 0
	for _, r := range sums {
		for _, p := range r {
			all.Write(p)
			parts++
		}
	}
	if got := hex.EncodeToString(all.Sum(nil)) + "-" + strconv.Itoa(parts); got != f.obj.ETag {
		return source.Errorf(source.Corrupt, "%q: parts' MD5 %s does not match ETag %s", f.obj.Key, got, f.obj.ETag)
	}
	return nil
}

// fetchRange reads [off, off+n) in one ranged GET into the scratch file and returns its CRC (crc
// names the algorithm), or else the MD5 of each part it holds.
func (s *stream) fetchRange(ctx context.Context, f *fileNode, off, n int64, crc string) ([][]byte, error) {
	rc, err := f.m.cfg.Fetcher.Open(ctx, f.obj, off, n)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	part := n
	if crc == "" {
		part = s.layout.PartSize
	}
	buf := make([]byte, 1<<20)
	var sums [][]byte
	for at := off; at < off+n; at += part {
		k := min(part, off+n-at)
		var h hash.Hash = md5.New()
		if crc != "" {
			h = newHash(crc)
		}
		got, err := io.CopyBuffer(io.MultiWriter(io.NewOffsetWriter(s.file, at), h), io.LimitReader(rc, k), buf)
		if err != nil {
			return nil, err
		}
		if got != k {
			return nil, source.Errorf(source.Corrupt, "%q bytes %d-%d: got %d bytes, want %d", f.obj.Key, at, at+k-1, got, k)
		}
		sums = append(sums, h.Sum(nil))
	}
	// The range must end where asked: more bytes mean it is not the range asked for.
	if extra, _ := rc.Read(buf[:1]); extra != 0 {
		return nil, source.Errorf(source.Corrupt, "%q bytes %d-%d: more bytes than asked for", f.obj.Key, off, off+n-1)
	}
	return sums, nil
}
