package writeback

import (
	"encoding/base64"
	"hash"
	"hash/crc32"
	"io"
	"os"

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
