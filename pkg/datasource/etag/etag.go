// Package etag is the arithmetic of S3 entity tags: the MD5 of an object uploaded whole, or, for
// a multipart upload, the MD5 of its parts' MD5s and the part count ("<md5>-N"). A multipart ETag
// checks the bytes only under the part size they were uploaded with, which old servers do not
// report: Candidates infers the likely ones from the object's size and part count, and Multi
// computes the ETag under each of them in one pass.
package etag

import (
	"crypto/md5"
	"encoding/hex"
	"hash"
	"regexp"
	"slices"
	"strconv"
)

var (
	md5RE       = regexp.MustCompile(`^[0-9a-f]{32}$`)
	multipartRE = regexp.MustCompile(`^([0-9a-f]{32})-([0-9]+)$`)
)

// IsMD5 reports whether etag is the MD5 of an object uploaded whole.
func IsMD5(etag string) bool { return md5RE.MatchString(etag) }

// Parts is the part count of a multipart ETag, 0 for any other.
func Parts(etag string) int64 {
	m := multipartRE.FindStringSubmatch(etag)
	if m == nil {
		return 0
	}
	n, err := strconv.ParseInt(m[2], 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}

// Fits reports whether an object of size bytes uploaded in parts of partSize has parts parts.
func Fits(size, parts, partSize int64) bool {
	return partSize > 0 && parts > 0 && (size+partSize-1)/partSize == parts
}

// MaxCandidates bounds the part sizes Candidates returns: each costs an MD5 over most of the
// object.
const MaxCandidates = 8

const mib = 1 << 20

// toolDefaults are the part sizes common uploaders use, tried first: the AWS CLI and SDKs (8 MiB),
// rclone and the Go SDK's transfer manager (5 MiB), s3cmd (15 MiB), minio's client (16 MiB), and
// the 64 MiB of tools tuned for large objects.
var toolDefaults = []int64{8 * mib, 5 * mib, 15 * mib, 16 * mib, 64 * mib}

// Candidates are the part sizes an object of size bytes with a multipart ETag of parts parts was
// likely uploaded with, most likely first, at most MaxCandidates: hint alone when it fits (the
// part size the uploader recorded), otherwise the uniform part sizes p with ceil(size/p) == parts
// that are whole MiB, common tools' defaults first. One part is its object whole. With many
// parts the window of p is narrower than a MiB, so there is one candidate or none.
func Candidates(size, parts, hint int64) []int64 {
	switch {
	case parts <= 0 || size <= 0:
		return nil
	case Fits(size, parts, hint):
		return []int64{hint}
	case parts == 1:
		return []int64{size}
	}
	// ceil(size/p) == parts  <=>  size/parts <= p < size/(parts-1)
	lo, hi := (size+parts-1)/parts, (size-1)/(parts-1)
	if lo > hi {
		return nil
	}
	var out []int64
	for _, d := range toolDefaults {
		if d >= lo && d <= hi {
			out = append(out, d)
		}
	}
	for m := (lo + mib - 1) / mib; m*mib <= hi && len(out) < MaxCandidates; m++ {
		if !slices.Contains(out, m*mib) {
			out = append(out, m*mib)
		}
	}
	return out[:min(len(out), MaxCandidates)]
}

// PartSizes are the part sizes a multipart ETag tag of an object of size bytes is checked under:
// the one the server reported when it fits (inferred false), otherwise the Candidates from the
// part count and the uploader's recorded hint (inferred true: a mismatch under them may be an
// unusual part size rather than damage). None for an ETag that is not multipart.
func PartSizes(size int64, tag string, reported, hint int64) (sizes []int64, inferred bool) {
	parts := Parts(tag)
	switch {
	case parts == 0:
		return nil, false
	case Fits(size, parts, reported):
		return []int64{reported}, false
	}
	return Candidates(size, parts, hint), true
}

// Of is the ETag of parts' MD5s (each md5.Size bytes, one after another), as a multipart upload
// of len(sums)/md5.Size parts gets it.
func Of(sums []byte) string {
	sum := md5.Sum(sums)
	return hex.EncodeToString(sum[:]) + "-" + strconv.Itoa(len(sums)/md5.Size)
}

// Multi is a hash.Hash over an object's bytes from its first on that computes its multipart ETag
// under several part sizes at once. Sum appends, per part size in order, the MD5 of the parts'
// MD5s (Match compares them with an ETag). The first part is the same bytes under every part
// size up to the smallest: one MD5 runs over the object's start for all of them.
type Multi struct {
	sizes []int64
	parts []hash.Hash // each size's part under way, past its first
	sums  [][]byte    // the finished parts' MD5s, per size
	first hash.Hash   // the first part's MD5, shared
	off   int64
}

// NewMulti returns a Multi for partSizes (each > 0).
func NewMulti(partSizes []int64) *Multi {
	m := &Multi{sizes: partSizes, first: md5.New()}
	m.Reset()
	return m
}

func (m *Multi) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		// The next boundary of any size's part: bytes up to it go into the same parts.
		step := int64(len(p))
		for _, s := range m.sizes {
			step = min(step, s-m.off%s)
		}
		b := p[:step]
		if m.off < slices.Max(m.sizes) {
			m.first.Write(b)
		}
		for k, s := range m.sizes {
			if m.off >= s {
				m.parts[k].Write(b)
			}
		}
		m.off += step
		p = p[step:]
		for k, s := range m.sizes {
			if m.off%s != 0 {
				continue
			}
			if m.off == s {
				m.sums[k] = m.first.Sum(m.sums[k])
			} else {
				m.sums[k] = m.parts[k].Sum(m.sums[k])
				m.parts[k].Reset()
			}
		}
	}
	return n, nil
}

// Sum appends, per part size, the MD5 of the parts' MD5s so far (a last part cut short counts).
func (m *Multi) Sum(b []byte) []byte {
	for k, s := range m.sizes {
		sums := m.sums[k]
		switch {
		case m.off == 0 || m.off%s == 0:
		case m.off < s:
			sums = m.first.Sum(slices.Clip(sums))
		default:
			sums = m.parts[k].Sum(slices.Clip(sums))
		}
		sum := md5.Sum(sums)
		b = append(b, sum[:]...)
	}
	return b
}

// Reset starts over.
func (m *Multi) Reset() {
	m.first.Reset()
	m.off = 0
	m.parts = make([]hash.Hash, len(m.sizes))
	m.sums = make([][]byte, len(m.sizes))
	for k := range m.sizes {
		m.parts[k] = md5.New()
	}
}

func (m *Multi) Size() int      { return md5.Size * len(m.sizes) }
func (m *Multi) BlockSize() int { return md5.BlockSize }

// Match returns the part size under which sum (Multi's Sum over an object's bytes, for
// partSizes) gives etag; ok is false when none does.
func Match(sum []byte, partSizes []int64, size int64, etag string) (partSize int64, ok bool) {
	m := multipartRE.FindStringSubmatch(etag)
	if m == nil || len(sum) != md5.Size*len(partSizes) {
		return 0, false
	}
	parts := Parts(etag)
	for k, s := range partSizes {
		if Fits(size, parts, s) && hex.EncodeToString(sum[k*md5.Size:(k+1)*md5.Size]) == m[1] {
			return s, true
		}
	}
	return 0, false
}
