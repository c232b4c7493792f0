package stage

// What each entry is checked against, when the source gives no full-object checksum: its MD5
// ETag, or its multipart ETag under the part size the server reports or, on servers that report
// none, the part sizes inferred from its size and part count (package etag). An entry nothing
// checks is unverifiable: refused, unless the administrator serves such entries (Config.Unverifiable).

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"

	"github.com/cistern-csi/cistern/pkg/datasource/etag"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// wholeCheck is the digest a whole read of o (a small entry) is checked by, beside a full-object
// checksum the response may carry: its MD5, or its multipart ETag under the inferred part sizes
// (sizes). nil when its ETag checks nothing.
func wholeCheck(o source.Object) (newHash func() hash.Hash, sizes []int64) {
	if etag.IsMD5(o.ETag) {
		return md5.New, nil
	}
	if sizes = etag.Candidates(o.Size, etag.Parts(o.ETag), 0); len(sizes) > 0 {
		return func() hash.Hash { return etag.NewMulti(sizes) }, sizes
	}
	return nil, nil
}

// checkableWhole reports whether a whole read of o is checked by an MD5 digest, which bytes a
// peer chose cannot match: what lets peers serve it.
func checkableWhole(o source.Object) bool {
	h, _ := wholeCheck(o)
	return h != nil
}

// checkWhole compares sum, wholeCheck's digest over o's bytes, with o's ETag.
func checkWhole(o source.Object, sum []byte, sizes []int64) error {
	if sizes == nil {
		if got := hex.EncodeToString(sum); got != o.ETag {
			return source.Errorf(source.Corrupt, "%q: MD5 %s does not match ETag %s", o.Key, got, o.ETag)
		}
		return nil
	}
	if _, ok := etag.Match(sum, sizes, o.Size, o.ETag); !ok {
		return noSizeMatches(o, sizes)
	}
	return nil
}

// errNoSizeMatches marks the Corrupt error of a multipart entry whose ETag matches under none of
// the part sizes inferred for it: a wrong byte, or parts of a size not inferred. The entry is read
// again (from the source, a peer's bytes dropped); if it still matches under none, it is
// unverifiable (sizeUnverifiable).
var errNoSizeMatches = errors.New("the ETag matches under none of the likely part sizes")

func noSizeMatches(o source.Object, sizes []int64) error {
	return source.Wrap(source.Corrupt, errNoSizeMatches, "%q: ETag %s, part sizes tried %v", o.Key, o.ETag, sizes)
}

// sizeUnverifiable hands an entry whose ETag matched under no inferred part size, read twice
// from the source, to the administrator's policy.
func (j *Job) sizeUnverifiable(ctx context.Context, o source.Object, err error) error {
	return j.unverifiable(ctx, o, source.Wrap(source.Unverifiable, err,
		"the server reports no checksum and no part size, and bytes read twice match under no likely part size (a byte is wrong at the source, or the parts were of another size)"))
}

// unverifiable hands err, about an entry nothing could check, to the administrator's policy: nil
// serves the entry unchecked; without a policy it is refused.
func (j *Job) unverifiable(ctx context.Context, o source.Object, err error) error {
	if j.e.cfg.Unverifiable == nil {
		return err
	}
	return j.e.cfg.Unverifiable(ctx, j.id, o, err)
}

// uncheckable is the error of an entry that has nothing to check it by.
func uncheckable(o source.Object) error {
	if etag.Parts(o.ETag) > 0 {
		return source.Errorf(source.Unverifiable,
			"%q: the server reports no checksum and no part size, and no likely part size fits ETag %s for %d bytes", o.Key, o.ETag, o.Size)
	}
	return source.Errorf(source.Unverifiable, "%q: the server reports no checksum, and ETag %q is not an MD5", o.Key, o.ETag)
}

// partCheck is how the ETag of a large multipart entry o checks it: under partSize (the server's,
// when its part count fits, or the one inferred or recorded), or under each of sizes (several
// inferred); inferred says the part size is not the server's. All empty: not multipart, or
// nothing fits. For an entry its CRC checks, the part size is asked for only when peers may serve
// ranges of it, which are checked against the parts' MD5s too (a CRC cannot check bytes a peer
// chose).
func (j *Job) partCheck(ctx context.Context, p source.Planner, o source.Object, plan source.Plan) (partSize int64, sizes []int64, inferred bool, err error) {
	if etag.Parts(o.ETag) == 0 {
		return 0, nil, false, nil
	}
	partSize = plan.PartSize
	if _, isCRC := crcAlgos[plan.Checksum.Algorithm]; isCRC {
		if !j.peers.mayShare() {
			return 0, nil, false, nil
		}
		if partSize, err = p.PartSize(ctx, o); err != nil {
			return 0, nil, false, err
		}
	}
	sizes, inferred = etag.PartSizes(o.Size, o.ETag, partSize, plan.PartSizeHint)
	switch {
	case !inferred:
		return sizes[0], nil, false, nil
	case len(sizes) == 0:
		return 0, nil, true, nil
	case len(sizes) == 1 && etag.Parts(o.ETag) > 1:
		// One part is the object whole: its ranges stay parallel, checked at the end.
		return sizes[0], nil, true, nil
	}
	return 0, sizes, true, nil
}

// checkETag checks the object's bytes in f against its ETag: its MD5, or, for a multipart
// object, the MD5 of its parts' MD5s under one of sizes (one pass over the file). matched is the
// part size that matched. Through a descriptor of its own: f may be written with direct I/O,
// which a plain read of it cannot use.
func checkETag(f *os.File, o source.Object, sizes []int64) (matched int64, err error) {
	multipart := len(sizes) > 0
	if !etag.IsMD5(o.ETag) && !multipart {
		return 0, source.Errorf(source.Corrupt, "%q: no MD5 to check bytes from peers against", o.Key)
	}
	r, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		return 0, err
	}
	defer r.Close()
	h := md5.New()
	if multipart {
		h = etag.NewMulti(sizes)
	}
	if _, err := io.Copy(h, io.NewSectionReader(r, 0, o.Size)); err != nil {
		return 0, err
	}
	if !multipart {
		if got := hex.EncodeToString(h.Sum(nil)); got != o.ETag {
			return 0, source.Errorf(source.Corrupt, "%q: MD5 %s does not match ETag %s", o.Key, got, o.ETag)
		}
		return 0, nil
	}
	if matched, ok := etag.Match(h.Sum(nil), sizes, o.Size, o.ETag); ok {
		return matched, nil
	}
	return 0, source.Errorf(source.Corrupt, "%q: parts' MD5s under part sizes %v do not match ETag %s", o.Key, sizes, o.ETag)
}
