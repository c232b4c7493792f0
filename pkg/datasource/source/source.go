// Package source defines what the staging engine needs from a dataset source (S3, NFS, a node-local
// directory): a point-in-time listing and ranged reads. Implementations live in sibling packages.
package source

import (
	"context"
	"io"
)

// Type is the kind of a dataset entry.
type Type string

const (
	File    Type = "f"
	Dir     Type = "d"
	Symlink Type = "l"
)

// Object is one entry of a dataset manifest. Key is relative to the dataset root, '/'-separated,
// and validated by ValidateKey before anything is written for it.
type Object struct {
	Key  string `json:"k"`
	Type Type   `json:"t"`
	Size int64  `json:"s,omitempty"`
	// ETag is the S3 entity tag without quotes. Reads are pinned to it, so the bytes staged are the
	// bytes listed even if the object is overwritten meanwhile.
	ETag string `json:"e,omitempty"`
	// Version is a change token for sources without ETags (NFS, local: mtime and size).
	Version string `json:"v,omitempty"`
	// Target is a symlink's target.
	Target string `json:"l,omitempty"`
	// Mode holds permission bits where the source has them (0 means the default).
	Mode uint32 `json:"m,omitempty"`
}

// Source is a dataset origin. Implementations must be safe for concurrent Open calls.
type Source interface {
	// List calls fn for every entry under the dataset root, in any order. Keys are relative.
	List(ctx context.Context, fn func(Object) error) error
	// Open returns the bytes [off, off+n) of a file entry as listed (pinned to obj.ETag/Version).
	Open(ctx context.Context, obj Object, off, n int64) (io.ReadCloser, error)
	// Verify is called after a file has been fully read; sources that can detect a change since
	// the listing (mtime, size) report it here.
	Verify(ctx context.Context, obj Object) error
	// Close releases connections.
	Close() error
}

// CountingLister is implemented by sources whose listings go through entries they do not hand to
// List's fn (S3's common prefixes): ListCounting is List, and calls seen for every entry gone
// through, handed to fn or not, from any goroutine. The minimum listing rate counts them
// (dataset.ListingSlots).
type CountingLister interface {
	ListCounting(ctx context.Context, fn func(Object) error, seen func()) error
}

// Checksum is an object's full-object checksum as S3 carries it: the algorithm (CRC32, CRC32C,
// CRC64NVME, SHA1, SHA256) and its base64 value. The zero value is "none".
type Checksum struct {
	Algorithm, Value string
}

// Checksummed is implemented by a reader of a whole object that came with a full-object checksum:
// the engine computes it over the bytes as they stream and compares.
type Checksummed interface {
	Checksum() Checksum
}

// ReadChecker is implemented by sources whose read rights can differ from entry to entry (S3:
// object ACLs, bucket policies by prefix or key; NFS: owners, groups and modes). CheckRead asks the server, with the source's
// credentials and without transferring data, whether obj may be read as listed (pinned to its
// ETag): nil, or a Denied, Changed or NotFound error.
type ReadChecker interface {
	CheckRead(ctx context.Context, obj Object) error
}

// Planner is implemented by sources that can say, before reading a large object, how best to
// verify it (S3): a full-object checksum is checked over one full read or, for a CRC, over
// parallel ranges whose CRCs combine; otherwise a multipart object's reads align on its parts,
// whose MD5s make up its ETag. PartSize is a multipart object's part size (0: not multipart),
// which a staging that may take ranges from peers needs even when the object has a CRC: bytes a
// peer chose can match any CRC, not the parts' MD5s.
type Planner interface {
	Plan(ctx context.Context, obj Object) (Plan, error)
	PartSize(ctx context.Context, obj Object) (int64, error)
}

// Plan is how to read one large object.
type Plan struct {
	// Checksum is the object's full-object checksum, if it has one.
	Checksum Checksum
	// PartSize is the size of the object's parts (all but the last) as the server reports it,
	// 0 when not multipart or not reported.
	PartSize int64
	// PartSizeHint is the part size the uploader recorded with the object (Cistern's write-back:
	// PartSizeMetadata), 0 if none: a candidate to check the multipart ETag by, not a fact.
	PartSizeHint int64
}

// PartSizeMetadata is the S3 user metadata (x-amz-meta-cistern-part-size, decimal bytes) in which
// Cistern's write-back records the part size of a multipart upload, for servers that do not
// report it.
const PartSizeMetadata = "cistern-part-size"

// Part is a range of an object with a checksum of its own (an S3 multipart part uploaded with a
// checksum): a reader can check it without reading the rest of the object.
type Part struct {
	Off, N   int64
	Checksum Checksum
}

// Parter is implemented by sources that can report an object's parts with their checksums (S3
// GetObjectAttributes). An object without such parts gives none (nil, nil).
type Parter interface {
	Parts(ctx context.Context, obj Object) ([]Part, error)
}
