package peer

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"regexp"
)

// Audience is the audience of the ServiceAccount tokens peers present: a token for the API
// server (or any other audience) is refused, and a peer token is good for nothing else.
const Audience = "cistern-peer"

// Annotations a node publishes on its StoragePools: where its peer port is, and the SHA-256 of the
// certificate it serves there (hex).
const (
	AnnotationEndpoint = "peer.cistern.csi.dev/endpoint"
	AnnotationCertHash = "peer.cistern.csi.dev/cert-sha256"
)

// Have is what a node holds of one dataset version.
type Have struct {
	// Ready is set when the node holds the whole version; Entries, Ranges and Busy are then
	// empty.
	Ready bool `json:"ready,omitempty"`
	// Batch is the most pieces the node sends in answer to one batch request; 0 from a node of
	// an earlier version, which is asked for its pieces one by one.
	Batch int `json:"batch,omitempty"`
	// Entries is a bitmap over the manifest's entries (bit i of byte i/8, least significant bit
	// first): entry i is complete and verified.
	Entries []byte `json:"entries,omitempty"`
	// Ranges are byte ranges of entries still being fetched that the node read from the source
	// itself. (Ranges it got from peers are served only once the whole entry is verified.)
	Ranges []Range `json:"ranges,omitempty"`
	// Busy are pieces the node is reading from the source right now: a fetcher that needs one
	// waits for it rather than reading it from the source too.
	Busy []Range `json:"busy,omitempty"`
}

// Range is the bytes [Off, Off+N) of manifest entry Index.
type Range struct {
	Index int64 `json:"i"`
	Off   int64 `json:"o"`
	N     int64 `json:"n"`
}

// covers reports whether r holds all of [off, off+n) of entry i.
func (r Range) covers(i, off, n int64) bool {
	return r.Index == i && r.Off <= off && off+n <= r.Off+r.N
}

// HasEntry reports whether entry i is complete.
func (h *Have) HasEntry(i int64) bool {
	if h.Ready {
		return true
	}
	return i >= 0 && i/8 < int64(len(h.Entries)) && h.Entries[i/8]&(1<<(i%8)) != 0
}

// Has reports whether the node holds [off, off+n) of entry i.
func (h *Have) Has(i, off, n int64) bool {
	if h.HasEntry(i) {
		return true
	}
	for _, r := range h.Ranges {
		if r.covers(i, off, n) {
			return true
		}
	}
	return false
}

// IsBusy reports whether the node is reading [off, off+n) of entry i from the source now.
func (h *Have) IsBusy(i, off, n int64) bool {
	for _, r := range h.Busy {
		if r.covers(i, off, n) {
			return true
		}
	}
	return false
}

// SetEntry marks entry i complete in a bitmap, growing it as needed.
func SetEntry(bits []byte, i int64) []byte {
	for int64(len(bits)) <= i/8 {
		bits = append(bits, 0)
	}
	bits[i/8] |= 1 << (i % 8)
	return bits
}

var (
	validID     = regexp.MustCompile(`^[a-f0-9]{8,64}$`)
	validDigest = regexp.MustCompile(`^[a-f0-9]{32,64}$`)
)

// BindVersion names a dataset version (its manifest digest) in requests from node asker to node
// server: a keyed hash, the digest the key. A digest comes only from a listing of the source;
// a node that learns this name — a compromised node posing as a holder of every dataset, asked
// by honest nodes — can neither recover the digest nor use the name with any other node, since
// each server checks the name against the authenticated asker and itself. So a node is served a
// version only when it listed the source itself.
func BindVersion(digest, asker, server string) string {
	mac := hmac.New(sha256.New, []byte(digest))
	fmt.Fprintf(mac, "cistern-peer-version\x00%s\x00%s", asker, server)
	return hex.EncodeToString(mac.Sum(nil)[:16])
}

// checkVersion refuses names that are not a dataset ID and a manifest digest.
func checkVersion(id, digest string) error {
	if !validID.MatchString(id) || !validDigest.MatchString(digest) {
		return fmt.Errorf("not a dataset version: %q %q", id, digest)
	}
	return nil
}

// A batch request (POST batchPath) names up to MaxBatchPieces pieces of one version, MaxBatchBytes
// in all: a node reading many small entries from a peer asks for them in one request, not one
// HTTPS request per entry. It takes one upload slot, and its bytes count against the node's
// upload bandwidth as any piece's.
const (
	MaxBatchPieces = 256
	MaxBatchBytes  = 16 << 20
	// maxBatchBody bounds the request's JSON: MaxBatchPieces ranges with room to spare.
	maxBatchBody = 64 << 10
)

// batchRequest is the body of a batch request.
type batchRequest struct {
	Pieces []Range `json:"pieces"`
}

// The answer to a batch request is a frame per piece asked, in the order asked: a status byte,
// the length of what follows (8 bytes, big-endian), then the piece's N bytes when the status is
// frameHeld, nothing when it is frameNotHeld (the node stopped holding it, or cannot read it).
const (
	frameHeld    = 0
	frameNotHeld = 1
	frameHeader  = 9

	batchContentType = "application/vnd.cistern.peer-batch.v1"
)

// checkBatch refuses a batch that is empty, too large, or names an impossible piece.
func checkBatch(pieces []Range) error {
	if len(pieces) == 0 || len(pieces) > MaxBatchPieces {
		return fmt.Errorf("a batch names 1 to %d pieces, not %d", MaxBatchPieces, len(pieces))
	}
	var total int64
	for _, p := range pieces {
		// Off+N must not overflow: a piece ending past MaxInt64 would pass a store's bounds check
		// as a negative end (found by FuzzBatchRequest).
		if p.Index < 0 || p.Off < 0 || p.N <= 0 || p.N > MaxBatchBytes || p.Off > math.MaxInt64-p.N {
			return fmt.Errorf("bad piece %+v", p)
		}
		if total += p.N; total > MaxBatchBytes {
			return errors.New("a batch of more than MaxBatchBytes")
		}
	}
	return nil
}

func batchPath(id, digest string) string { return "/v1/datasets/" + id + "/" + digest + "/batch" }

func havePath(id, digest string) string { return "/v1/datasets/" + id + "/" + digest + "/have" }
func entryPath(id, digest string, i, off, n int64) string {
	return fmt.Sprintf("/v1/datasets/%s/%s/entries/%d?off=%d&n=%d", id, digest, i, off, n)
}
