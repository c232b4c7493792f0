package stage

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cistern-csi/cistern/pkg/datasource/etag"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// TestPeerBytesNeedMoreThanACRC: a compromised peer can serve bytes of its choosing that match
// an object's full-object CRC (a CRC is linear: eight bytes it also chooses set it to any
// value). Such bytes pass the CRC and must still fail: a range a peer served is checked against
// the MD5 as well. From the source (trusted), the CRC alone is the check.
func TestPeerBytesNeedMoreThanACRC(t *testing.T) {
	a := crcAlgos["CRC64NVME"]
	data := make([]byte, 1<<20)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	forged := forgeCRC(t, a, data, []byte("bytes of the peer's choosing"), 4096)
	crcOf := func(b []byte) uint64 { h := a.new(); h.Write(b); return a.sum(h) }
	if crcOf(forged) != crcOf(data) || string(forged) == string(data) {
		t.Fatal("the forgery does not match the object's CRC")
	}
	// The object uploaded whole (an MD5 ETag) and in parts of 256 KiB (a multipart ETag).
	const partSize = 256 << 10
	whole := md5.Sum(data)
	var partSums []byte
	for off := 0; off < len(data); off += partSize {
		s := md5.Sum(data[off : off+partSize])
		partSums = append(partSums, s[:]...)
	}
	for _, c := range []struct {
		name      string
		etag      string
		etagParts int64
	}{
		{"MD5 ETag", hex.EncodeToString(whole[:]), 0},
		{"multipart ETag", fmt.Sprintf("%x-%d", md5.Sum(partSums), len(data)/partSize), partSize},
	} {
		t.Run(c.name, func(t *testing.T) {
			obj := source.Object{Key: "model.bin", Size: int64(len(data)), ETag: c.etag}
			check := func(content []byte, from []peer.Peer) error {
				path := filepath.Join(t.TempDir(), "tmp")
				if err := os.WriteFile(path, content, 0o600); err != nil {
					t.Fatal(err)
				}
				f, err := os.OpenFile(path, os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				b := &bigFile{out: newOutput(f, obj.Size, false), crc: &a, crcWant: a.encode(crcOf(data)),
					rangeSums: []uint64{crcOf(content)}, chunk: obj.Size, from: [][]peer.Peer{from}, etagParts: c.etagParts}
				return (&Job{}).verifyBig(context.Background(), task{obj: obj, big: b})
			}
			peers := []peer.Peer{{Node: "node-b"}}
			if err := check(forged, peers); source.KindOf(err) != source.Corrupt {
				t.Errorf("bytes from a peer that match the CRC but not the ETag: %v, want Corrupt", err)
			}
			if err := check(data, peers); err != nil {
				t.Errorf("the object's own bytes from a peer: %v, want accepted", err)
			}
			if err := check(forged, nil); err != nil {
				t.Errorf("bytes from the source that match its CRC: %v, want accepted (the source is trusted)", err)
			}
		})
	}
}

// forgeCRC returns data with evil written at its start and eight bytes at fix chosen so that
// the CRC is unchanged.
func forgeCRC(t *testing.T, a crcAlgo, data, evil []byte, fix int) []byte {
	t.Helper()
	crc := func(b []byte) uint64 { h := a.new(); h.Write(b); return a.sum(h) }
	base := crc(data)
	// The change each bit flip makes to the CRC (the same whatever the other bytes: linear).
	effect := func(pos, bit int) uint64 {
		b := append([]byte(nil), data...)
		b[pos] ^= 1 << bit
		return crc(b) ^ base
	}
	out := append([]byte(nil), data...)
	copy(out, evil)
	target := crc(out) ^ base // what the eight bytes at fix must cancel
	// Gaussian elimination over GF(2): rows are the 64 bit flips at fix, each with the set of
	// flips it stands for.
	type row struct{ v, flips uint64 }
	var basis [64]*row
	for k := range 64 {
		rw := &row{v: effect(fix+k/8, k%8), flips: 1 << k}
		for bit := 63; bit >= 0 && rw.v != 0; bit-- {
			if rw.v&(1<<bit) == 0 {
				continue
			}
			if basis[bit] == nil {
				basis[bit] = rw
				break
			}
			rw.v, rw.flips = rw.v^basis[bit].v, rw.flips^basis[bit].flips
		}
	}
	var flips uint64
	for bit := 63; bit >= 0; bit-- {
		if target&(1<<bit) == 0 {
			continue
		}
		if basis[bit] == nil {
			t.Fatal("the bit flips at fix do not span the CRC")
		}
		target, flips = target^basis[bit].v, flips^basis[bit].flips
	}
	for k := range 64 {
		if flips&(1<<k) != 0 {
			out[fix+k/8] ^= 1 << (k % 8)
		}
	}
	return out
}

// TestPeerBytesUnderInferredPartSizes: an object of a server that reports no part size is
// checked by its multipart ETag under the part sizes inferred for it, one (its ranges aligned on
// it) or several (checked at once at the end). A peer's bytes that match under none are Corrupt,
// never unverifiable, whatever the node's policy for unverifiable objects: they are read again
// from the source.
func TestPeerBytesUnderInferredPartSizes(t *testing.T) {
	const mib = 1 << 20
	data := make([]byte, 9*mib) // 2 parts of 5 MiB: 5, 6, 7 and 8 MiB fit
	r := rand.New(rand.NewPCG(5, 6))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	sums := make([][]byte, 0, 2)
	for off := 0; off < len(data); off += 5 * mib {
		s := md5.Sum(data[off:min(off+5*mib, len(data))])
		sums = append(sums, s[:])
	}
	obj := source.Object{Key: "model.bin", Size: int64(len(data)), ETag: etag.Of(slices.Concat(sums...))}
	wrong := slices.Clone(data)
	wrong[6*mib] ^= 1
	serve := &Engine{cfg: Config{Unverifiable: func(context.Context, string, source.Object, error) error { return nil }}}
	for _, c := range []struct {
		name string
		big  func() *bigFile
	}{
		{"several part sizes", func() *bigFile { return &bigFile{sizes: etag.Candidates(obj.Size, 2, 0)} }},
		{"one part size, inferred", func() *bigFile {
			return &bigFile{partSize: 5 * mib, inferred: true, partSums: [][]byte{sums[0], md5Of(wrong[5*mib:])}}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			check := func(content []byte, from []peer.Peer) error {
				path := filepath.Join(t.TempDir(), "tmp")
				if err := os.WriteFile(path, content, 0o600); err != nil {
					t.Fatal(err)
				}
				f, err := os.OpenFile(path, os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				b := c.big()
				b.out, b.chunk, b.from = newOutput(f, obj.Size, false), obj.Size, [][]peer.Peer{from}
				if b.partSize > 0 && string(content) == string(data) {
					b.partSums = sums
				}
				return (&Job{e: serve}).verifyBig(context.Background(), task{obj: obj, big: b})
			}
			peers := []peer.Peer{{Node: "node-b"}}
			if err := check(wrong, peers); source.KindOf(err) != source.Corrupt {
				t.Errorf("a wrong byte from a peer: %v, want Corrupt", err)
			}
			if err := check(wrong, nil); !errors.Is(err, errNoSizeMatches) {
				t.Errorf("a wrong byte from the source: %v, want it read again (no part size matches)", err)
			}
			if err := check(data, peers); err != nil {
				t.Errorf("the object's own bytes from a peer: %v, want accepted", err)
			}
		})
	}
}

func md5Of(b []byte) []byte { s := md5.Sum(b); return s[:] }
