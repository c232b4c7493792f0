package stage

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

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
				_, err = (&Job{}).verifyBig(context.Background(), task{obj: obj, big: b})
				return err
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
