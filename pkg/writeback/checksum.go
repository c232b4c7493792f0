package writeback

import (
	"crypto/md5"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"os"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/minio/crc64nvme"
)

// sumAlg is the checksum the server verifies on every part and small file, and composes into
// the whole object's FULL_OBJECT checksum. New uploads use CRC-32C: the CPU computes it (SSE 4.2)
// in the SDK and in the server, where CRC-64/NVME cost both a software table pass (a profile of
// a 2 GiB upload, docs/benchmarks.md). CRC-64/NVME remains for multipart uploads a journal
// started before (their parts were sent with it, and a resumed upload keeps its algorithm).
type sumAlg string

const (
	algCRC32C    sumAlg = "CRC32C"
	algCRC64NVME sumAlg = "CRC64NVME"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// algorithm is a's name in S3 requests.
func (a sumAlg) algorithm() types.ChecksumAlgorithm { return types.ChecksumAlgorithm(a) }

func (a sumAlg) hash() hash.Hash {
	if a == algCRC64NVME {
		return crc64nvme.New()
	}
	return crc32.New(castagnoli)
}

// of is a's checksum of n bytes of fh at off, as S3 spells it (base64, big-endian).
func (a sumAlg) of(fh *os.File, off, n int64) (string, error) {
	h := a.hash()
	if _, err := io.Copy(h, io.NewSectionReader(fh, off, n)); err != nil {
		return "", err
	}
	return sumString(h), nil
}

// sumString spells a CRC as S3 does: base64 of its big-endian bytes (what Sum appends).
func sumString(h hash.Hash) string { return base64.StdEncoding.EncodeToString(h.Sum(nil)) }

// pick is a's checksum among those a server's answer carries ("" when it has none).
func (a sumAlg) pick(crc32c, crc64 *string) string {
	p := crc32c
	if a == algCRC64NVME {
		p = crc64
	}
	if p == nil {
		return ""
	}
	return *p
}

// part is a completed part with its checksum of a.
func (a sumAlg) part(num int32, etag *string, sum string) types.CompletedPart {
	p := types.CompletedPart{PartNumber: &num, ETag: etag}
	if a == algCRC64NVME {
		p.ChecksumCRC64NVME = &sum
	} else {
		p.ChecksumCRC32C = &sum
	}
	return p
}

// bodySums are what one read of a body sent gives: its checksum of the upload's algorithm (the
// x-amz-checksum-* header, verified by a server with flexible checksums) and its MD5
// (Content-MD5, which every S3 server verifies, refusing a body that differs with BadDigest).
type bodySums struct {
	sum string // base64, as S3 spells it
	md5 []byte
}

// sums reads n bytes of fh at off once for both.
func (a sumAlg) sums(fh *os.File, off, n int64) (bodySums, error) {
	h, m := a.hash(), md5.New()
	if _, err := io.Copy(io.MultiWriter(h, m), io.NewSectionReader(fh, off, n)); err != nil {
		return bodySums{}, err
	}
	return bodySums{sum: sumString(h), md5: m.Sum(nil)}, nil
}

// contentMD5 is the Content-MD5 header of the body.
func (b bodySums) contentMD5() *string {
	s := base64.StdEncoding.EncodeToString(b.md5)
	return &s
}

// confirmMD5 is a record's Confirm when the server confirmed the bytes by an ETag that is their
// MD5 (a server without flexible checksums); "" is by the checksum of the upload's algorithm.
const confirmMD5 = "md5"

// proof is how the server confirmed that an object holds the file's bytes: its checksum (Sum),
// or, from a server that answers none (Ceph RGW before flexible checksums), its ETag being the
// MD5 of the body (ETag, unquoted, lower case) or, for a multipart object, the MD5 of its parts'
// MD5s and their count (md5hex-N) with parts of PartSize bytes.
type proof struct {
	Sum, ETag string
	PartSize  int64
}

// byMD5 says the server confirmed the bytes by their MD5 ETag.
func (p proof) byMD5() bool { return p.Sum == "" && p.ETag != "" }

// confirm says whether the server's answer to a body sent with sent confirms it: the checksum
// it answered is the one sent, or, when it answered none, its ETag is the body's MD5. A server
// that answers neither confirms nothing (ErrUnconfirmed), and the object is not taken as stored.
func confirm(sent bodySums, answered string, etag *string) (proof, error) {
	switch {
	case answered != "" && answered != sent.sum:
		return proof{}, fmt.Errorf("the server answered checksum %s for a body whose checksum is %s", answered, sent.sum)
	case answered != "":
		return proof{Sum: answered}, nil
	case normETag(etag) == hex.EncodeToString(sent.md5):
		return proof{ETag: normETag(etag)}, nil
	}
	return proof{}, unconfirmed(etag)
}

// ErrUnconfirmed is an upload the server confirmed neither by a checksum nor by an MD5 ETag
// (an ETag of another kind: SSE-KMS, SSE-C, or a server's own scheme). Sending it again would
// not change that, so a job that meets it stops (Run) instead of retrying, and nothing of it is
// taken as stored.
var ErrUnconfirmed = errors.New("the server confirmed neither the object's checksum nor its MD5")

func unconfirmed(etag *string) error {
	return fmt.Errorf("%w (no x-amz-checksum in its answer, and its ETag %q is not the MD5 of the bytes sent: an encrypted bucket, SSE-KMS or SSE-C, answers such ETags); not retried", ErrUnconfirmed, aws.ToString(etag))
}

// normETag is an ETag without its quotes, in lower case.
func normETag(etag *string) string { return strings.ToLower(strings.Trim(aws.ToString(etag), `"`)) }

// md5Of is the MD5 of n bytes of fh at off.
func md5Of(fh *os.File, off, n int64) ([]byte, error) {
	h := md5.New()
	if _, err := io.Copy(h, io.NewSectionReader(fh, off, n)); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}
