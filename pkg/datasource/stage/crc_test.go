package stage

import (
	"math/rand/v2"
	"testing"
)

func TestCRCCombine(t *testing.T) {
	data := make([]byte, 1<<20+123)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	for name, a := range crcAlgos {
		t.Run(name, func(t *testing.T) {
			whole := a.new()
			whole.Write(data)
			want := a.sum(whole)
			for _, cuts := range [][]int{{0}, {1}, {len(data) / 2}, {1000, 5000, 700000}, {len(data)}} {
				var crc uint64
				prev := 0
				for i, cut := range append(cuts, len(data)) {
					h := a.new()
					h.Write(data[prev:cut])
					if i == 0 {
						crc = a.sum(h)
					} else {
						crc = a.combine(crc, a.sum(h), int64(cut-prev))
					}
					prev = cut
				}
				if crc != want {
					t.Fatalf("cuts %v: combined %x, want %x", cuts, crc, want)
				}
			}
		})
	}
}
