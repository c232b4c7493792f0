package peer

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"testing"
)

// frame is one batch answer frame as the server writes it.
func frame(status byte, payload []byte) []byte {
	var hdr [frameHeader]byte
	hdr[0] = status
	binary.BigEndian.PutUint64(hdr[1:], uint64(len(payload)))
	return append(hdr[:], payload...)
}

// FuzzBatchFrames: whatever bytes a peer answers a batch with, Next hands out at most each
// piece's N bytes, one frame per piece asked, and ends with io.EOF or an error, never a panic
// or a loop. The pieces asked are derived from the input's first bytes.
func FuzzBatchFrames(f *testing.F) {
	f.Add([]byte{3, 2, 5}, append(append(frame(frameHeld, []byte("abc")), frame(frameNotHeld, nil)...), frame(frameHeld, []byte("hello"))...))
	f.Add([]byte{4}, frame(frameHeld, []byte("ab")))                                    // short piece
	f.Add([]byte{1}, frame(frameHeld, []byte("abcdef")))                                // longer than asked
	f.Add([]byte{2, 2}, append(frame(7, []byte("xy")), 0, 0))                           // unknown status
	f.Add([]byte{1}, []byte{frameHeld, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) // huge length
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, sizes, answer []byte) {
		var pieces []Range
		for i, s := range sizes {
			if i == MaxBatchPieces {
				break
			}
			pieces = append(pieces, Range{Index: int64(i), N: int64(s) + 1})
		}
		if len(pieces) == 0 {
			pieces = []Range{{N: 1}}
		}
		b := &Batch{body: io.NopCloser(bytes.NewReader(answer)), r: bufio.NewReader(bytes.NewReader(answer)), pieces: pieces}
		for got := 0; ; got++ {
			if got > len(pieces) {
				t.Fatalf("more than %d frames from a batch of %d pieces", got, len(pieces))
			}
			r, held, err := b.Next()
			if errors.Is(err, io.EOF) {
				if got != len(pieces) {
					t.Fatalf("io.EOF after %d of %d pieces", got, len(pieces))
				}
				return
			}
			if err != nil {
				return
			}
			if !held {
				continue
			}
			n, _ := io.Copy(io.Discard, r)
			if n > pieces[got].N {
				t.Fatalf("piece %d: %d bytes handed out, asked %d", got, n, pieces[got].N)
			}
		}
	})
}

// FuzzBatchRequest: a batch request body (JSON, from any holder of a peer token) is decoded and
// checked as the server does; what passes names 1..MaxBatchPieces valid pieces of at most
// MaxBatchBytes in all.
func FuzzBatchRequest(f *testing.F) {
	f.Add([]byte(`{"pieces":[{"i":0,"o":0,"n":10},{"i":3,"o":5,"n":1}]}`))
	f.Add([]byte(`{"pieces":[]}`))
	f.Add([]byte(`{"pieces":[{"i":-1,"o":0,"n":1}]}`))
	f.Add([]byte(`{"pieces":[{"i":0,"o":0,"n":9223372036854775807},{"i":0,"o":0,"n":9223372036854775807}]}`))
	f.Add([]byte(`{"pieces":[{"i":0,"o":9223372036854775807,"n":16777216}]}`))
	f.Add([]byte(`{"pieces":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var req batchRequest
		if err := json.NewDecoder(io.LimitReader(bytes.NewReader(body), maxBatchBody)).Decode(&req); err != nil {
			return
		}
		if checkBatch(req.Pieces) != nil {
			return
		}
		if len(req.Pieces) == 0 || len(req.Pieces) > MaxBatchPieces {
			t.Fatalf("a batch of %d pieces passed", len(req.Pieces))
		}
		var total int64
		for _, p := range req.Pieces {
			if p.Index < 0 || p.Off < 0 || p.N <= 0 || p.Off+p.N < p.Off {
				t.Fatalf("piece %+v passed", p)
			}
			total += p.N
		}
		if total > MaxBatchBytes {
			t.Fatalf("a batch of %d bytes passed", total)
		}
	})
}

// FuzzHave: a peer's `have` answer (JSON) is decoded as the client does, and every question the
// fetcher asks of it is answered without a panic, for any index, offset and length.
func FuzzHave(f *testing.F) {
	f.Add([]byte(`{"ready":true,"batch":256}`), int64(0), int64(0), int64(1))
	f.Add([]byte(`{"entries":"/w==","ranges":[{"i":9,"o":0,"n":100}],"busy":[{"i":10,"o":5,"n":5}]}`), int64(9), int64(10), int64(20))
	f.Add([]byte(`{"entries":"AQ=="}`), int64(-8), int64(0), int64(1))
	f.Add([]byte(`{"ranges":[{"i":1,"o":9223372036854775807,"n":9223372036854775807}]}`), int64(1), int64(9223372036854775806), int64(2))
	f.Fuzz(func(t *testing.T, body []byte, i, off, n int64) {
		h := &Have{}
		if err := json.NewDecoder(bytes.NewReader(body)).Decode(h); err != nil {
			return
		}
		h.HasEntry(i)
		h.Has(i, off, n)
		h.IsBusy(i, off, n)
		if i >= 0 && !h.Ready && int64(len(h.Entries)) <= i/8 && h.HasEntry(i) {
			t.Fatalf("entry %d held beyond a bitmap of %d bytes", i, len(h.Entries))
		}
	})
}
