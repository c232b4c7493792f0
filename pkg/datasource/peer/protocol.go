package peer

import (
	"fmt"
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
	// Ready is set when the node holds the whole version; the other fields are then empty.
	Ready bool `json:"ready,omitempty"`
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

// checkVersion refuses names that are not a dataset ID and a manifest digest.
func checkVersion(id, digest string) error {
	if !validID.MatchString(id) || !validDigest.MatchString(digest) {
		return fmt.Errorf("not a dataset version: %q %q", id, digest)
	}
	return nil
}

func havePath(id, digest string) string { return "/v1/datasets/" + id + "/" + digest + "/have" }
func entryPath(id, digest string, i, off, n int64) string {
	return fmt.Sprintf("/v1/datasets/%s/%s/entries/%d?off=%d&n=%d", id, digest, i, off, n)
}
