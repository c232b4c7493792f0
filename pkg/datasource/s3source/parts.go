package s3source

import (
	"context"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// maxPartsPage is the most parts S3 lists in one GetObjectAttributes answer.
const maxPartsPage = 1000

// Parts lists a multipart object's parts with their own checksums (GetObjectAttributes,
// ObjectParts): what a streaming read checks one part against without reading the others. An
// object that is not multipart, or whose parts carry no checksum (uploaded without one, or a
// server that does not report them), has none: nil, nil. An object whose ETag is no longer the
// listed one is Changed.
func (s *Source) Parts(ctx context.Context, obj source.Object) ([]source.Part, error) {
	if !strings.Contains(obj.ETag, "-") {
		return nil, nil // a single PUT: no parts
	}
	var parts []source.Part
	var off int64
	marker := 0 // the last part number listed
	in := &s3.GetObjectAttributesInput{
		Bucket:           aws.String(s.cfg.Bucket),
		Key:              aws.String(s.cfg.Prefix + obj.Key),
		ObjectAttributes: []types.ObjectAttributes{types.ObjectAttributesEtag, types.ObjectAttributesObjectParts},
		MaxParts:         aws.Int32(maxPartsPage),
	}
	for {
		out, err := s.client.GetObjectAttributes(ctx, in)
		if err != nil {
			err = classify(err, "reading the parts of %s%s", s.where(), obj.Key)
			switch source.KindOf(err) {
			case source.Changed, source.NotFound, source.Retryable:
				return nil, err
			}
			// Not granted (s3:GetObjectAttributes is a right of its own) or not implemented:
			// the object is read and checked whole, as staging does.
			return nil, nil
		}
		if etag := strings.Trim(aws.ToString(out.ETag), `"`); etag != "" && etag != obj.ETag {
			return nil, source.Errorf(source.Changed, "%s%s: ETag %s, listed %s", s.where(), obj.Key, etag, obj.ETag)
		}
		if out.ObjectParts == nil {
			return nil, nil
		}
		for _, p := range out.ObjectParts.Parts {
			sum := partChecksum(p)
			if sum.Algorithm == "" {
				return nil, nil // one part without a checksum: the object is checked whole
			}
			n := aws.ToInt64(p.Size)
			parts = append(parts, source.Part{Off: off, N: n, Checksum: sum})
			off += n
		}
		if !aws.ToBool(out.ObjectParts.IsTruncated) || out.ObjectParts.NextPartNumberMarker == nil {
			break
		}
		next, err := strconv.Atoi(aws.ToString(out.ObjectParts.NextPartNumberMarker))
		if err != nil || next <= marker {
			return nil, nil // a list that does not move on would be asked for forever
		}
		marker = next
		in.PartNumberMarker = aws.String(strconv.Itoa(next))
	}
	if off != obj.Size {
		return nil, nil // parts that do not add up to the object say nothing a read can rely on
	}
	return parts, nil
}

// partChecksum picks a part's checksum, cheapest first.
func partChecksum(p types.ObjectPart) source.Checksum {
	for _, c := range []struct {
		algo  string
		value *string
	}{{"CRC32C", p.ChecksumCRC32C}, {"CRC64NVME", p.ChecksumCRC64NVME}, {"CRC32", p.ChecksumCRC32},
		{"SHA256", p.ChecksumSHA256}, {"SHA1", p.ChecksumSHA1}} {
		if v := aws.ToString(c.value); v != "" {
			return source.Checksum{Algorithm: c.algo, Value: v}
		}
	}
	return source.Checksum{}
}

var _ source.Parter = (*Source)(nil)
