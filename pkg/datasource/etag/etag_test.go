package etag

import (
	"crypto/md5"
	"math/rand/v2"
	"slices"
	"testing"
)

// upload is the ETag a multipart upload of data in parts of partSize gets.
func upload(data []byte, partSize int) string {
	var sums []byte
	for off := 0; off < len(data); off += partSize {
		s := md5.Sum(data[off:min(off+partSize, len(data))])
		sums = append(sums, s[:]...)
	}
	return Of(sums)
}

func TestCandidates(t *testing.T) {
	for _, c := range []struct {
		name              string
		size, parts, hint int64
		want              []int64
	}{
		// 1000 parts: the window [size/1000, size/999) is narrower than a MiB.
		{"many parts", 1000*8*mib - 3, 1000, 0, []int64{8 * mib}},
		{"two parts", 8 * mib, 2, 0, []int64{5 * mib, 4 * mib, 6 * mib, 7 * mib}},
		{"two parts, bounded, defaults first", 20 * mib, 2, 0,
			[]int64{15 * mib, 16 * mib, 10 * mib, 11 * mib, 12 * mib, 13 * mib, 14 * mib, 17 * mib}},
		{"hint that fits", 8 * mib, 2, 5*mib + 7, []int64{5*mib + 7}},
		{"hint that does not fit", 8 * mib, 2, 3 * mib, []int64{5 * mib, 4 * mib, 6 * mib, 7 * mib}},
		{"one part", 123, 1, 0, []int64{123}},
		{"no whole MiB in the window", 100 * (5*mib + 1), 100, 0, nil},
		{"not multipart", 10, 0, 0, nil},
	} {
		if got := Candidates(c.size, c.parts, c.hint); !slices.Equal(got, c.want) {
			t.Errorf("%s: Candidates(%d, %d, %d) = %v, want %v", c.name, c.size, c.parts, c.hint, got, c.want)
		}
		for _, p := range Candidates(c.size, c.parts, c.hint) {
			if !Fits(c.size, c.parts, p) {
				t.Errorf("%s: candidate %d gives %d parts, not %d", c.name, p, (c.size+p-1)/p, c.parts)
			}
		}
	}
}

// Multi under several part sizes matches the upload's under its own, whatever the writes' sizes.
func TestMultiMatches(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, 10*mib+12345)
	for k := range data {
		data[k] = byte(r.Uint32())
	}
	sizes := []int64{4 * mib, 5 * mib, 6*mib + 1, 11 * mib}
	for _, want := range sizes {
		etag := upload(data, int(want))
		m := NewMulti(sizes)
		for rest := data; len(rest) > 0; {
			n := min(len(rest), 1+r.IntN(3*mib))
			m.Write(rest[:n])
			rest = rest[n:]
		}
		if got, ok := Match(m.Sum(nil), sizes, int64(len(data)), etag); !ok || got != want {
			t.Errorf("uploaded in parts of %d: Match = %d, %v", want, got, ok)
		}
		// One byte flipped: no part size matches.
		flipped := slices.Clone(data)
		flipped[len(flipped)/2] ^= 1
		m.Reset()
		m.Write(flipped)
		if got, ok := Match(m.Sum(nil), sizes, int64(len(data)), etag); ok {
			t.Errorf("uploaded in parts of %d, a byte flipped: matched under %d", want, got)
		}
	}
	if _, ok := Match(NewMulti(sizes).Sum(nil), sizes, int64(len(data)), upload(data, 3*mib)); ok {
		t.Error("parts of 3 MiB matched under candidates without it")
	}
}

// PartSizes trusts the server's part size only when it fits the ETag's part count.
func TestPartSizes(t *testing.T) {
	tag := upload(make([]byte, 8*mib), 5*mib) // 2 parts
	for _, c := range []struct {
		name           string
		tag            string
		reported, hint int64
		want           []int64
		inferred       bool
	}{
		{"reported fits", tag, 5 * mib, 6 * mib, []int64{5 * mib}, false},
		{"reported does not fit: inferred", tag, 3 * mib, 0, []int64{5 * mib, 4 * mib, 6 * mib, 7 * mib}, true},
		{"none reported: the hint", tag, 0, 6 * mib, []int64{6 * mib}, true},
		{"not multipart", "0123456789abcdef0123456789abcdef", 5 * mib, 0, nil, false},
	} {
		got, inferred := PartSizes(8*mib, c.tag, c.reported, c.hint)
		if !slices.Equal(got, c.want) || inferred != c.inferred {
			t.Errorf("%s: PartSizes = %v, %v; want %v, %v", c.name, got, inferred, c.want, c.inferred)
		}
	}
}
